"""``python -m alloctrace``: the same command line as the ``alloctrace`` script.

The console script points at :func:`main` here (``alloctrace.__main__:main``); the commands
themselves live in ``alloctrace._commands`` (one module per subcommand).
"""

import sys

from alloctrace._commands import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
