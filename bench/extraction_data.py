"""Set-up for bench/extraction.py: trafilatura's evaluation pages and their gold snippets, copied out
of a trafilatura checkout or bare mirror into an ignored folder (never committed: ~900 pages).

Writes `OUT/pages/NNNN.html` (the page's bytes as trafilatura stores them) and `OUT/gold.jsonl`, one
line per page: url, file, `with` / `without` snippets (trafilatura's tests/evaldata.json), `split`
and `language`. The split is fixed by a hash of the URL (dev: tune on it; held_out: report only),
so it does not move when pages are added. The language is fastText lid.176's label for the page's
`with` snippets joined (the gold article text), the model the language stage uses.

    python bench/extraction_data.py --source /work/.mirror/adbar+trafilatura/repo --out out/extraction_eval
"""

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

# One URL in this many (by hash) is held out; the rest is the development split.
HELD_OUT_EVERY = 3


def read_source(source: Path, rel: str) -> bytes | None:
    """A file of the trafilatura tree: from a work tree when `source` has one, else from a bare
    git directory's HEAD. None when it is in neither."""
    if (source / rel).is_file():
        return (source / rel).read_bytes()
    shown = subprocess.run(["git", "-C", str(source), "show", f"HEAD:{rel}"], capture_output=True)
    return shown.stdout if shown.returncode == 0 else None


def split_of(url: str) -> str:
    digest = int.from_bytes(hashlib.sha256(url.encode()).digest()[:8], "big")
    return "held_out" if digest % HELD_OUT_EVERY == 0 else "dev"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, required=True, help="trafilatura checkout or bare git mirror")
    ap.add_argument("--out", type=Path, default=Path("out/extraction_eval"))
    args = ap.parse_args()

    from refinery.stages.language import load_language_model

    evaldata = json.loads(read_source(args.source, "tests/evaldata.json"))
    model = load_language_model(None)
    pages = args.out / "pages"
    pages.mkdir(parents=True, exist_ok=True)
    rows, missing = [], 0
    for n, url in enumerate(sorted(evaldata)):
        item = evaldata[url]
        html = read_source(args.source, f"tests/eval/{item['file']}") or read_source(args.source, f"tests/cache/{item['file']}")
        if html is None:
            missing += 1
            continue
        name = f"{n:04d}.html"
        (pages / name).write_bytes(html)
        language, _ = model.predict(" ".join(item["with"]))
        rows.append({"url": url, "file": name, "with": item["with"], "without": item["without"],
                     "split": split_of(url), "language": language})
    tmp = args.out / "gold.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, args.out / "gold.jsonl")
    print(f"{len(rows)} pages ({missing} listed but absent) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
