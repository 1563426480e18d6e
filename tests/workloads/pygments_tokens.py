"""pygments lexes generated Python source and formats it to HTML; the token list (tuples,
strings) and the HTML stay alive."""

import pygments
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer


def source(functions):
    return "".join(
        f"def function_{i}(a, b={i}):\n"
        f'    """Docstring {i}."""\n'
        f"    values = [a * {i}, b + {i}.5, 'text {i}']\n"
        f"    return {{'key': values, 'n': {i}}}  # comment {i}\n\n"
        for i in range(functions)
    )


def setup():
    list(pygments.lex(source(2), PythonLexer()))


def run():
    code = source(300)
    tokens = list(pygments.lex(code, PythonLexer()))
    html = pygments.highlight(code, PythonLexer(), HtmlFormatter(linenos=True))
    return tokens, html
