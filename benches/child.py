"""Entry point of every benchmark child process: ``python child.py PART ARGS...``.

It is deliberately tiny.  The standard tracemalloc maps every captured frame's bytecode offset
to a line number by scanning that code object's line table from its start, so a long module or
function sitting under the benchmark on the stack would inflate tracemalloc's cost with the
harness's own code.  Every frame the harness keeps below a timed workload is short for the same
reason.
"""

import importlib
import sys

importlib.import_module(sys.argv[1]).child_main(sys.argv[2:])
