"""Load the shared plain-text corpus and split it into train / validation text.

The split follows ``shared/corpus/README.md``: for a file of ``N`` lines, ``k = floor(0.95 * N)``;
train is lines ``1..k`` and validation is lines ``k+1..N``. Lines keep their ``'\\n'`` terminators, so
``train + val`` is exactly the file's text (what ``head -n k`` / ``tail -n +k+1`` produce).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The six Jane Austen novels (the target style), in a fixed order.
AUSTEN_SOURCES: tuple[str, ...] = (
    "emma",
    "mansfield_park",
    "northanger_abbey",
    "persuasion",
    "pride_and_prejudice",
    "sense_and_sensibility",
)
#: The King James Bible.
KJV_SOURCE: str = "kjv"
#: All seven sources, Austen first.
ALL_SOURCES: tuple[str, ...] = AUSTEN_SOURCES + (KJV_SOURCE,)
#: Fraction of each file's lines that goes to the train split.
TRAIN_FRACTION_PERCENT: int = 95


@dataclass(frozen=True)
class SourceSplit:
    """The train and validation text of one corpus file."""

    name: str
    train: str
    val: str

    @property
    def text(self) -> str:
        """The whole file's text (train followed by validation)."""
        return self.train + self.val


def default_corpus_dir() -> Path:
    """Return ``shared/corpus`` beside the repository root (``<repo>/../shared/corpus``)."""
    repo_root = Path(__file__).resolve().parents[2]
    return repo_root.parent / "shared" / "corpus"


def resolve_corpus_dir(corpus: str | Path | None) -> Path:
    """Resolve a ``--corpus`` argument; relative paths are taken relative to the repository root.

    ``None`` means :func:`default_corpus_dir`.
    """
    if corpus is None:
        return default_corpus_dir()
    path = Path(corpus)
    if not path.is_absolute():
        repo_root = Path(__file__).resolve().parents[2]
        path = repo_root / path
    return path.resolve()


def split_lines(text: str) -> list[str]:
    """Split ``text`` on ``'\\n'`` only, keeping each terminator (so ``''.join`` restores ``text``).

    Unlike :meth:`str.splitlines`, no other character (form feed, U+2028, ...) ends a line, matching
    ``wc -l`` / ``head -n``. A final line without a terminator is kept as its own line.
    """
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def train_line_count(n_lines: int) -> int:
    """Return ``k = floor(0.95 * n_lines)`` in exact integer arithmetic."""
    return n_lines * TRAIN_FRACTION_PERCENT // 100


def split_text(text: str) -> tuple[str, str]:
    """Split one file's text into (train, val) by the README rule."""
    lines = split_lines(text)
    k = train_line_count(len(lines))
    return "".join(lines[:k]), "".join(lines[k:])


def load_source(corpus_dir: Path, name: str) -> SourceSplit:
    """Read ``<corpus_dir>/<name>.txt`` (UTF-8) and split it."""
    text = (corpus_dir / f"{name}.txt").read_text(encoding="utf-8")
    train, val = split_text(text)
    return SourceSplit(name=name, train=train, val=val)


def load_corpus(corpus: str | Path | None = None) -> dict[str, SourceSplit]:
    """Load all seven sources (six Austen novels + ``kjv``), keyed by name, Austen first."""
    corpus_dir = resolve_corpus_dir(corpus)
    if not corpus_dir.is_dir():
        raise FileNotFoundError(f"corpus directory not found: {corpus_dir}")
    return {name: load_source(corpus_dir, name) for name in ALL_SOURCES}


def train_texts(splits: dict[str, SourceSplit]) -> dict[str, str]:
    """Map each source name to its train text."""
    return {name: s.train for name, s in splits.items()}


def val_texts(splits: dict[str, SourceSplit]) -> dict[str, str]:
    """Map each source name to its validation text."""
    return {name: s.val for name, s in splits.items()}
