"""docutils parses a generated reST document and renders it to HTML; the document tree and the
HTML stay alive (the issue 13 case: ``Element.__init__``'s lists and dicts)."""

import docutils.core

SETTINGS = {"_disable_config": True, "report_level": 5, "embed_stylesheet": False}


def source(sections):
    parts = ["=========\nWorkload\n=========\n"]
    for i in range(sections):
        parts.append(
            f"Section {i}\n{'=' * (8 + len(str(i)))}\n\n"
            f"Paragraph *{i}* with **strong** text, ``literal {i}`` and a link_{i}.\n\n"
            f".. _link_{i}: https://example.org/{i}\n\n"
            f"- item {i}.1\n- item {i}.2 with *emphasis*\n\n"
            "+-----+-----+\n| a   | b   |\n+=====+=====+\n"
            f"| {i:<3} | {i * 2:<3} |\n+-----+-----+\n\n"
        )
    return "".join(parts)


def setup():
    # The whole pipeline once, so that its lazy imports happen before tracing.
    tree = docutils.core.publish_doctree(source(2), settings_overrides=SETTINGS)
    docutils.core.publish_from_doctree(tree, writer_name="html", settings_overrides=SETTINGS)


def run():
    text = source(150)
    tree = docutils.core.publish_doctree(text, settings_overrides=SETTINGS)
    html = docutils.core.publish_from_doctree(tree, writer_name="html", settings_overrides=SETTINGS)
    return tree, html
