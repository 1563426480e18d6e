#!/usr/bin/env bash
# Makes docs/report.png, the README's picture of `alloctrace report`, from examples/service.py:
# ten seconds of the service with a snapshot every second, then the report of that series,
# photographed by headless Chromium (Debian's chromium package).
#
#   PYTHON=/path/to/python-with-alloctrace docs/report_picture.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A copy under a short relative path keeps the file names in the picture short.
mkdir "$work/examples"
cp "$repo/examples/service.py" "$work/examples/"
cd "$work"
ALLOCTRACE=3 ALLOCTRACE_DUMP='service-{n}.snap' ALLOCTRACE_INTERVAL=1 \
    "$python" examples/service.py --seconds 10
"$python" -m alloctrace report service-*.snap -o report.html
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --hide-scrollbars --force-device-scale-factor=1 --user-data-dir="$work/profile" \
    --window-size=1040,880 --screenshot="$repo/docs/report.png" "file://$work/report.html" \
    2>/dev/null
echo "wrote $repo/docs/report.png"
