"""sympy expands, differentiates, factors and takes series of symbolic expressions; the results
stay alive. sympy's caches (its cache decorator, ``abc``'s subclass caches) hold entries whose
lifetime depends on when a collection runs, so this workload asks the driver to run it with
the collector off and to collect once before the snapshot: the same tracer then agrees with
itself to 0.1-0.5% instead of up to 3% (issue 13)."""

import sympy as sp

#: See driver.py: no automatic collection during run(), one full collection before the snapshot.
COLLECT_BEFORE_SNAPSHOT = True


def work(n):
    x, y, z = sp.symbols("x y z")
    out = []
    for k in range(1, n):
        e = sp.expand((x + k * y - z) ** (k % 5 + 2))
        out.append(e)
        out.append(sp.diff(e, x))
        out.append(sp.factor(x ** (k % 4 + 2) - y ** (k % 4 + 2)))
        out.append(sp.series(sp.sin(k * x) * sp.exp(x), x, 0, 6))
    return out


def setup():
    work(3)


def run():
    return work(25)
