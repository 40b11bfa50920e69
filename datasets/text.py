"""English text that is on the machine: vim's help files, Debian's license texts, man pages.

Used for sentence-embedding corpora and, later, haystacks and perplexity text. Man pages are
groff source; the markup is stripped with a few rules (good enough for embeddings, not for
typesetting).
"""
from __future__ import annotations

import glob
import gzip
import re
from collections.abc import Iterator
from pathlib import Path

SOURCES = {
    "vim-docs": "/usr/share/vim/vim*/doc/*.txt",
    "licenses": "/usr/share/common-licenses/*",
    "manpages": "/usr/share/man/man[1-8]/*.gz",
}

_GROFF_REQUEST = re.compile(r"^[.'](?!\s)")
_GROFF_ESCAPE = re.compile(r"\\f[BIRP]|\\f\(..|\\\(..|\\[-&e|^]|\\s[-+]?\d|\\\*\(..|\\\*.|\\.")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def source_files(sources=tuple(SOURCES)) -> list[Path]:
    files = []
    for name in sources:
        files += sorted(Path(p) for p in glob.glob(SOURCES[name]) if Path(p).is_file())
    return files


def read_document(path: Path) -> str:
    """Plain text of one file (man pages un-gzipped and stripped of groff markup)."""
    if path.suffix == ".gz":
        raw = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
        lines = []
        for line in raw.splitlines():
            if _GROFF_REQUEST.match(line):
                # keep the text of formatting macros (.B word, .SH NAME), drop other requests
                head, _, rest = line.partition(" ")
                if head[1:] in {"B", "I", "BR", "IR", "RB", "BI", "IB", "SH", "SS", "TP", "IP"} and rest:
                    lines.append(rest.replace('"', ""))
                continue
            lines.append(line)
        raw = "\n".join(lines).replace("\\-", "-")
        return _GROFF_ESCAPE.sub("", raw)
    return path.read_text("utf-8", "replace")


def sentences(sources=tuple(SOURCES), min_words: int = 6, max_words: int = 60) -> Iterator[str]:
    """Distinct sentence-like spans of on-machine text, in a stable order."""
    seen = set()
    for path in source_files(sources):
        try:
            text = read_document(path)
        except (OSError, EOFError, ValueError):
            continue
        for paragraph in re.split(r"\n\s*\n", text):
            flat = " ".join(paragraph.split())
            for sent in _SENTENCE_END.split(flat):
                words = sent.split()
                if not min_words <= len(words) <= max_words:
                    continue
                letters = sum(c.isalpha() for c in sent)
                if letters < 0.6 * len(sent):
                    continue
                key = sent.lower()
                if key not in seen:
                    seen.add(key)
                    yield sent
