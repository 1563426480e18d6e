"""Python-Markdown converts a generated document; the converter (with its element tree) and
the HTML stay alive."""

import markdown


def source(sections):
    return "".join(
        f"# Heading {i}\n\nSome *emphasis* and **strong** text, `code {i}` and "
        f"[a link](https://example.org/{i}).\n\n- one {i}\n- two {i}\n\n"
        f"> quoted {i}\n\n    indented code {i}\n\n"
        for i in range(sections)
    )


def setup():
    markdown.Markdown(extensions=["tables"]).convert(source(2))


def run():
    md = markdown.Markdown(extensions=["tables"])
    html = md.convert(source(300))
    return md, html
