"""sympy expands, differentiates and simplifies symbolic expressions; the results (expression
trees, sympy's cache of them) stay alive (the issue 13 case: one line at +863% when free-list
reuse was not re-attributed)."""

import sympy


def work(n):
    x, y = sympy.symbols("x y")
    poly = sympy.expand((x + 2 * y + 1) ** n)
    derivative = sympy.diff(poly, x, 2)
    factored = sympy.factor(x**n - y**n)
    series = sympy.series(sympy.sin(x) * sympy.exp(x), x, 0, n)
    return poly, derivative, factored, series


def setup():
    work(3)


def run():
    return work(7)
