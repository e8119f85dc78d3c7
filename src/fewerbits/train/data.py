"""Training data: the embedded default corpus, user data, the tokenizer, batches.

The default corpus is the Python source of three pure-Python packages pinned as fewerbits'
dependencies — sympy 1.14.0, mpmath 1.3.0 and networkx 3.6.1 (BSD licensed; ~35 MB, about
11 M tokens at vocabulary 8192). pip installs their files byte for byte from the wheels, so
every machine reads the same bytes; their sha256 is checked against the pinned value and logged.
Nothing is downloaded at run time and no third-party text lives in this repository.

Documents are files (default corpus, folders), lines (JSONL with a `text` field) or blank-line
separated paragraphs (a single text file). A document goes to validation when the sha256 of its
name (its index for unnamed ones) falls in the first 2% of the hash space, so no document is
ever in both splits and the split does not depend on the order files are listed.

The tokenizer is a byte-level BPE trained with Hugging Face `tokenizers` on the training split
only, cached with the token ids under (corpus sha256, vocabulary size). Token ids are stored as
uint16 (uint32 above 65536 entries) and read back as memmaps. A pre-tokenized `.bin` of raw
uint16/uint32 ids is used as is; its last 2% of tokens are the validation split.

Batches are a pure function of (seed, step, micro-batch): resuming at step s reads exactly the
tokens an uninterrupted run would. Validation uses a fixed, seeded set of windows, so every
recipe is evaluated on the same tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

#: package -> (version, sha256 of its sorted (path, bytes) stream): the default corpus
DEFAULT_CORPUS = {
    "sympy": ("1.14.0", "4a382a050d5d4bed4585b49d512af966b5c8c8b5db952ddad378b1642309d000"),
    "mpmath": ("1.3.0", "1b1d43c2fac3e0e8d9f61adaeb2c6e85078d6a088b517cb02ea522c459b2372d"),
    "networkx": ("3.6.1", "1c769ad60fb93f72f966db2fed6f9d33075ceb61dd6445b9c6f8f146b44b8b48"),
}
VAL_FRACTION = 0.02
EOT = "<|endoftext|>"


class DataError(ValueError):
    """Bad or missing data; the message says what to do."""


@dataclass
class Corpus:
    """Documents (name, text) with the split already decided, and a fingerprint."""

    name: str
    train: list[str]
    val: list[str]
    sha256: str


def _is_val(name: str) -> bool:
    h = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    return h < VAL_FRACTION * 16**8


def _split(named_docs: list[tuple[str, str]], name: str, sha: str) -> Corpus:
    train, val = [], []
    for doc_name, text in named_docs:
        if text.strip():
            (val if _is_val(doc_name) else train).append(text)
    if not train or not val:
        raise DataError(f"{name}: too few documents to split into train and validation (need a few dozen)")
    return Corpus(name, train, val, sha)


def package_sources(package: str) -> tuple[list[tuple[str, str]], str]:
    """The .py files of an installed package, sorted by path, and the sha256 of (path, bytes)."""
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise DataError(f"the default corpus needs the package {package}; pip install -e . installs it") from None
    files = sorted(str(f) for f in dist.files or () if str(f).endswith(".py") and str(f).startswith(f"{package}/"))
    digest = hashlib.sha256()
    docs = []
    for rel in files:
        data = Path(dist.locate_file(rel)).read_bytes()
        digest.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
        docs.append((rel, data.decode("utf-8")))
    return docs, digest.hexdigest()


def default_corpus() -> Corpus:
    """The embedded corpus, checked byte for byte against the pinned fingerprints."""
    docs, digests = [], []
    for package, (version, expected) in DEFAULT_CORPUS.items():
        found = metadata.version(package) if _installed(package) else None
        if found != version:
            raise DataError(
                f"the default corpus needs {package}=={version} (found {found}); "
                f"pip install '{package}=={version}' or pass --data"
            )
        pkg_docs, sha = package_sources(package)
        if sha != expected:
            raise DataError(
                f"{package} {version} is installed but its files differ from the pinned corpus "
                f"(sha256 {sha[:12]}…, expected {expected[:12]}…); reinstall it from PyPI or pass --data"
            )
        docs += pkg_docs
        digests.append(sha)
    return _split(docs, "default corpus", hashlib.sha256("".join(digests).encode()).hexdigest())


def _installed(package: str) -> bool:
    try:
        metadata.version(package)
        return True
    except metadata.PackageNotFoundError:
        return False


def user_corpus(path: str | Path) -> Corpus:
    """A text file, a folder of text files, or a JSONL file with a `text` field."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"data path {path} does not exist")
    digest = hashlib.sha256()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        docs = []
        for f in files:
            data = f.read_bytes()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue  # not text
            rel = f.relative_to(path).as_posix()
            digest.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
            docs.append((rel, text))
    else:
        data = path.read_bytes()
        digest.update(data)
        text = data.decode("utf-8", errors="replace")
        if path.suffix == ".jsonl":
            docs = []
            for i, line in enumerate(text.splitlines()):
                if line.strip():
                    try:
                        docs.append((f"line {i}", json.loads(line)["text"]))
                    except (json.JSONDecodeError, KeyError, TypeError):
                        raise DataError(f"{path}:{i + 1}: each JSONL line needs a string field 'text'") from None
        else:
            paragraphs = [p for p in text.split("\n\n") if p.strip()]
            docs = [(f"paragraph {i}", p + "\n\n") for i, p in enumerate(paragraphs)]
    if not any(t.strip() for _, t in docs):
        raise DataError(f"data path {path} holds no text")
    return _split(docs, str(path), digest.hexdigest())


# -- tokenizer and token files --------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE on `texts` (deterministic for the same texts and size)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[EOT],
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _encode(tok, texts: list[str], dtype) -> np.ndarray:
    eot = tok.token_to_id(EOT)
    out = []
    for i in range(0, len(texts), 256):
        for enc in tok.encode_batch(texts[i : i + 256]):
            out.append(np.asarray(enc.ids + [eot], dtype=dtype))
    return np.concatenate(out) if out else np.zeros(0, dtype=dtype)


@dataclass
class TokenData:
    """Token ids of both splits (memmaps), and where they came from."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    fingerprint: str  #: sha256 of the source bytes
    source: str  #: "default corpus", a path
    tokenizer_path: Path | None  #: tokenizer.json, None for pre-tokenized data

    def describe(self) -> str:
        return (
            f"{self.source}: {len(self.train):,} train / {len(self.val):,} validation tokens, "
            f"vocab {self.vocab_size}, sha256 {self.fingerprint[:16]}"
        )


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "fewerbits"


def prepare(data: str | None, vocab_size: int = 8192, cache_dir: str | Path | None = None,
            token_dtype: str = "uint16") -> TokenData:
    """Token ids for `data` (None: the default corpus), building and caching them once."""
    if data is not None and Path(data).suffix == ".bin":
        return _pretokenized(Path(data), vocab_size, token_dtype)
    corpus = default_corpus() if data is None else user_corpus(data)
    cache = Path(cache_dir or default_cache_dir()) / f"corpus-{corpus.sha256[:16]}" / f"vocab-{vocab_size}"
    if not (cache / "meta.json").exists():
        _build(corpus, vocab_size, cache)
    meta = json.loads((cache / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    return TokenData(
        train=np.memmap(cache / "train.bin", dtype=dtype, mode="r"),
        val=np.memmap(cache / "val.bin", dtype=dtype, mode="r"),
        vocab_size=meta["vocab_size"],
        fingerprint=corpus.sha256,
        source=corpus.name,
        tokenizer_path=cache / "tokenizer.json",
    )


def _build(corpus: Corpus, vocab_size: int, cache: Path) -> None:
    """Train the tokenizer, encode both splits, and move the result into place atomically."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache.parent, prefix=".build-"))
    try:
        tok = train_tokenizer(corpus.train, vocab_size)
        dtype = np.uint16 if tok.get_vocab_size() <= 1 << 16 else np.uint32
        _encode(tok, corpus.train, dtype).tofile(tmp / "train.bin")
        _encode(tok, corpus.val, dtype).tofile(tmp / "val.bin")
        tok.save(str(tmp / "tokenizer.json"))
        meta = {"vocab_size": tok.get_vocab_size(), "dtype": np.dtype(dtype).name, "sha256": corpus.sha256,
                "source": corpus.name, "train_documents": len(corpus.train), "val_documents": len(corpus.val)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        try:
            os.rename(tmp, cache)
        except OSError:  # another process finished first: keep its copy
            if not (cache / "meta.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pretokenized(path: Path, vocab_size: int, token_dtype: str) -> TokenData:
    if not path.exists():
        raise DataError(f"data path {path} does not exist")
    if token_dtype not in ("uint16", "uint32"):
        raise DataError(f"--token-dtype must be uint16 or uint32, not {token_dtype}")
    ids = np.memmap(path, dtype=np.dtype(token_dtype), mode="r")
    if len(ids) < 1000:
        raise DataError(f"{path} holds {len(ids)} tokens; that is too few to train on")
    top = int(ids.max())
    if top >= vocab_size:
        raise DataError(f"{path} holds token id {top}, beyond the vocabulary of {vocab_size}; pass --vocab-size {top + 1} or more")
    n_val = max(1, int(len(ids) * VAL_FRACTION))
    digest = hashlib.sha256(np.asarray(ids).tobytes()).hexdigest()
    return TokenData(ids[:-n_val], ids[-n_val:], vocab_size, digest, str(path), None)


# -- batches --------------------------------------------------------------------------------------


def batch(tokens: np.ndarray, batch_size: int, seq_len: int, seed: int, step: int, micro: int = 0):
    """(inputs, targets) of shape (batch_size, seq_len): windows drawn from (seed, step, micro)."""
    return _windows(tokens, batch_size, seq_len, [seed, step, micro])


def eval_windows(tokens: np.ndarray, n: int, seq_len: int, seed: int = 1234):
    """A fixed set of n validation windows (inputs, targets), the same for every run."""
    return _windows(tokens, n, seq_len, [seed, 1 << 40])  # a key no training step uses


def _windows(tokens: np.ndarray, n: int, seq_len: int, key: list[int]):
    if len(tokens) <= seq_len + 1:
        raise DataError(f"{len(tokens)} tokens cannot fill a window of {seq_len + 1}")
    rng = np.random.default_rng(key)
    starts = rng.integers(0, len(tokens) - seq_len - 1, n)
    windows = np.stack([np.asarray(tokens[s : s + seq_len + 1], dtype=np.int64) for s in starts])
    w = torch.from_numpy(windows)
    return w[:, :-1], w[:, 1:]
