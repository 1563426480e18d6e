"""jinja2 compiles a few templates and renders them over generated rows; the environment
(with its compiled templates) and the rendered pages stay alive."""

import jinja2

TEMPLATES = {
    "base.html": "<html><body>{% block body %}{% endblock %}</body></html>",
    "table.html": (
        "{% extends 'base.html' %}{% block body %}<table>"
        "{% for row in rows %}<tr class='{{ loop.cycle('odd', 'even') }}'>"
        "{% for cell in row.cells %}<td>{{ cell|e }}</td>{% endfor %}"
        "<td>{{ row.name|title }}</td></tr>{% endfor %}</table>{% endblock %}"
    ),
    "list.html": (
        "{% macro item(x) %}<li>{{ x.name }}: {{ x.cells|join(', ') }}</li>{% endmacro %}"
        "<ul>{% for row in rows %}{{ item(row) }}{% endfor %}</ul>"
    ),
}


def rows(n):
    return [{"name": f"row number {i}", "cells": [i, i * 2, f"<{i}>"]} for i in range(n)]


def setup():
    env = jinja2.Environment(loader=jinja2.DictLoader(TEMPLATES), autoescape=True)
    env.get_template("table.html").render(rows=rows(2))


def run():
    env = jinja2.Environment(loader=jinja2.DictLoader(TEMPLATES), autoescape=True)
    data = rows(400)
    pages = [env.get_template(name).render(rows=data) for name in ("table.html", "list.html")]
    parsed = [env.parse(src) for src in TEMPLATES.values()]
    return env, data, pages, parsed
