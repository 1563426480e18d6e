"""``python -m alloctrace``: the same command line as the ``alloctrace`` script.

The console script points at :func:`main` here (``alloctrace.__main__:main``); the commands
themselves live in ``alloctrace._cli``.
"""

import sys

from alloctrace._cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
