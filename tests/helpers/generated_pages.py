"""Reading back the HTML pages that synthetic/warc.py renders (render_page)."""

import html
import re


def article_text(page: str) -> str:
    """The title and paragraphs of a generated page, as the generator joined them."""
    article = page.split("<article>", 1)[1].split("</article>", 1)[0]
    parts = re.findall(r"<h1>(.*?)</h1>|<p>(.*?)</p>", article, re.S)
    return "\n\n".join(html.unescape(a or b) for a, b in parts)
