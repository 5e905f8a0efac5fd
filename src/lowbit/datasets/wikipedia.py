"""English Wikipedia text for language-model perplexity: the shortened dump in gensim's wheel.

gensim ships, as test data, ``enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2``: the
first pages of an English Wikipedia dump, each article cut short (106 articles, about 0.5 M words once the
markup is gone; CC BY-SA). No package ships WikiText-2, so this is lowbit's real English corpus. gensim itself
is never imported (only its folder is looked up); the markup is stripped with ``mwparserfromhell``:
templates, tables and files go, ``<ref>`` citations go whole, links keep their text.

Splits are fixed by article position in the dump: article ``i`` is ``test`` when ``i % 10 == 9``,
``validation`` when ``i % 10 == 8``, ``train`` otherwise. The stripped articles are cached (the strip takes
20-60 s on a loaded 2-core machine) in ``$LOWBIT_CACHE_DIR`` (else ``~/.cache/lowbit``) as one sealed JSON
file keyed by the dump's SHA-256 and the stripper's version; a cache file that fails its seal, its size
bound or its key is rebuilt.
"""

from __future__ import annotations

import bz2
import functools
import hashlib
import importlib.util
import os
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import torch

from lowbit._persist import Schema, decode_json, read_bytes, register, write_json
from lowbit.errors import ConfigError, LowbitError

SPLITS = ("train", "validation", "test")
CORPUS_VERSION = 1  # bump when the stripping below changes what the text is
MAX_CACHE_BYTES = 64 * 2**20  # the stripped corpus is ~3.4 MB; anything far larger is not ours
# the cache file: sealed JSON {"key", "seal", "articles"}; its version lives in the key (CORPUS_VERSION), so a
# file of another version is simply another cache
CACHE_SCHEMA = register(Schema("lowbit.corpus_cache", CORPUS_VERSION, "corpus cache", name_key=None,
                               version_key=None, limit=MAX_CACHE_BYTES))  # fmt: skip
INSTALL = "pip install 'lowbit[llm]' (gensim for the dump, mwparserfromhell to strip it)"


def dump_path() -> Path:
    """The shortened English dump inside the installed gensim package."""
    spec = importlib.util.find_spec("gensim")  # the folder only: gensim's __init__ loads scipy
    if spec is None or not spec.submodule_search_locations:
        raise LowbitError(f"the wikipedia dataset needs gensim's test data, and gensim is not installed: {INSTALL}")
    folder = Path(list(spec.submodule_search_locations)[0]) / "test" / "test_data"
    found = sorted(folder.glob("enwiki-*-shortened.bz2"))
    if not found:
        raise LowbitError(f"this gensim has no enwiki-*-shortened.bz2 under {folder}; gensim 4.x ships it: {INSTALL}")
    return found[0]


def _cache_dir() -> Path:  # the same folder lowbit.native caches its kernels in
    if os.environ.get("LOWBIT_CACHE_DIR"):
        return Path(os.environ["LOWBIT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lowbit"


def _read_pages(path: Path) -> list[tuple[str, str]]:
    """(title, wikitext) of every main-namespace article of the dump that is not a redirect, in dump order."""
    pages = []
    with bz2.open(path) as stream:
        for _, element in ElementTree.iterparse(stream):
            if not element.tag.endswith("}page"):
                continue
            namespace, text = element.find("{*}ns"), element.find("{*}revision/{*}text")
            if namespace is not None and namespace.text == "0" and element.find("{*}redirect") is None:
                pages.append((element.findtext("{*}title") or "", (text.text if text is not None else "") or ""))
            element.clear()
    return pages


def strip_markup(wikitext: str) -> str:
    """Plain text of one article: citations removed whole, the rest through mwparserfromhell's strip_code,
    runs of blank lines folded to one and spaces trimmed."""
    import mwparserfromhell

    code = mwparserfromhell.parse(wikitext)
    for tag in code.filter_tags(recursive=False, matches=lambda node: str(node.tag).strip().lower() == "ref"):
        code.remove(tag)
    text = code.strip_code(normalize=True, collapse=True)
    lines = [re.sub(r"[ \t]+", " ", line).strip() for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _key(path: Path) -> str:
    import mwparserfromhell

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return f"{digest}-mwparserfromhell-{mwparserfromhell.__version__}-v{CORPUS_VERSION}"


def _load_cache(file: Path, key: str) -> list[list[str]] | None:
    """The cached articles, or None when the file is missing, too large, damaged or of another key."""
    try:
        data = decode_json(CACHE_SCHEMA, read_bytes(CACHE_SCHEMA, file), str(file)).fields
    except LowbitError:
        return None
    articles = data.get("articles")
    if data.get("key") != key or not isinstance(articles, list):
        return None
    if not all(isinstance(a, list) and len(a) == 2 for a in articles):
        return None
    return articles


@functools.lru_cache(maxsize=1)
def articles() -> tuple[tuple[str, str], ...]:
    """(title, plain text) of every article, in dump order (read from the cache when it holds them)."""
    path = dump_path()
    if importlib.util.find_spec("mwparserfromhell") is None:
        raise LowbitError(f"the wikipedia dataset needs mwparserfromhell to strip the markup: {INSTALL}")
    key = _key(path)
    file = _cache_dir() / f"wikipedia-{key[:16]}.json"
    cached = _load_cache(file, key)
    if cached is None:
        cached = [[title, strip_markup(text)] for title, text in _read_pages(path)]
        try:
            write_json(CACHE_SCHEMA, file, {"key": key, "articles": cached}, indent=None, ensure_ascii=False)
        except OSError:  # a read-only cache folder: the text is still right, only slower next time
            pass
    return tuple((title, text) for title, text in cached if text)


def wikipedia_text(split: str = "test") -> list[str]:
    """The plain text of each article of ``split`` ("train", "validation" or "test")."""
    if split not in SPLITS:
        raise ConfigError(f"wikipedia has no split {split!r}; splits: {', '.join(SPLITS)}")
    remainder = {"test": (9,), "validation": (8,), "train": tuple(range(8))}[split]
    return [text for index, (_, text) in enumerate(articles()) if index % 10 in remainder]


def wikipedia_token_ids(tokenizer: Any, split: str = "test") -> torch.Tensor:
    """The articles of ``split`` tokenized one by one (no special tokens) and concatenated, a blank line
    between two articles: a 1-D LongTensor for :func:`lowbit.perplexity` and ``token_windows``."""
    pieces = [tokenizer(text + "\n\n", add_special_tokens=False, verbose=False)["input_ids"] for text in wikipedia_text(split)]
    return torch.tensor([token for piece in pieces for token in piece], dtype=torch.long)


__all__ = ["SPLITS", "articles", "dump_path", "strip_markup", "wikipedia_text", "wikipedia_token_ids"]
