"""Parallel text for the translation task, loaded through Hugging Face ``datasets``.

The default corpus is Multi30k German→English (Elliott et al. 2016, task 1, raw text):
29,000 training, 1,014 validation and 1,000 test pairs (test_2016_flickr).

Where the Multi30k files are looked for, first match wins (docs/architecture.md, "Data"):

1. ``data_dir`` (the ``--data_dir`` option),
2. ``$LLMSYS_DATA_DIR``,
3. ``data/multi30k`` in this repository,
4. the course-provided ``../shared/data/multi30k`` beside the repository;

if none holds the files, they are downloaded from the Multi30k repository's raw URLs
into ``data/multi30k``; if that fails too, :class:`DataNotFoundError` says where to
put them.
"""
from __future__ import annotations

import gzip
import os
import shutil
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
# split name -> file stem in the Multi30k repository
MULTI30K_SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
MULTI30K_LANGS = ("de", "en")
DATA_DIR_ENV = "LLMSYS_DATA_DIR"  # the folder of the Multi30k files, when --data_dir is not given


class DataNotFoundError(FileNotFoundError):
    """No folder holds the Multi30k files and they could not be downloaded."""


def multi30k_files() -> list[str]:
    """The file names a Multi30k folder must hold, e.g. ``train.de.gz``."""
    return [f"{stem}.{lang}.gz" for stem in MULTI30K_SPLITS.values() for lang in MULTI30K_LANGS]


def _complete(folder: Path) -> bool:
    return folder.is_dir() and all((folder / name).is_file() for name in multi30k_files())


def candidate_dirs(data_dir: str | os.PathLike | None = None) -> list[Path]:
    """The folders searched for Multi30k, in order."""
    found = []
    if data_dir:
        found.append(Path(data_dir))
    if os.environ.get(DATA_DIR_ENV):
        found.append(Path(os.environ[DATA_DIR_ENV]))
    found.append(REPO_ROOT / "data" / "multi30k")
    found.append(REPO_ROOT.parent / "shared" / "data" / "multi30k")
    return found


def download_multi30k(target: Path, base_url: str = MULTI30K_URL, timeout: float = 30.0) -> Path:
    """Download the Multi30k files into ``target``.

    Each file is written under a name of this process's own and renamed into place, so
    ranks that download at the same time never see or leave a half-written file.

    Raises:
        OSError: a file could not be fetched.
    """
    created = [p for p in [target, *target.parents] if not p.exists()]  # the folders this call makes
    target.mkdir(parents=True, exist_ok=True)
    try:
        for name in multi30k_files():
            dest = target / name
            if dest.is_file():
                continue
            tmp = dest.with_name(f"{name}.{os.getpid()}.part")  # several ranks may download at once
            try:
                with urllib.request.urlopen(f"{base_url}/{name}", timeout=timeout) as response, open(tmp, "wb") as out:
                    shutil.copyfileobj(response, out)
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)
    except OSError:
        for folder in created:  # a failed download leaves no empty folder (data/multi30k, data/) behind
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    return target


def resolve_data_dir(data_dir: str | os.PathLike | None = None, download: bool = True,
                     base_url: str = MULTI30K_URL) -> Path:
    """The first folder of :func:`candidate_dirs` that holds every Multi30k file.

    An explicit ``data_dir``, or ``$LLMSYS_DATA_DIR`` without one, that lacks the files is an
    error naming it (it is not silently passed over for another copy). Without either, the files
    are downloaded into ``data/multi30k`` when no folder has them.

    Raises:
        DataNotFoundError: with the folders tried and what to do.
    """
    needed = ", ".join(multi30k_files())
    if data_dir is not None:
        if _complete(Path(data_dir)):
            return Path(data_dir)
        raise DataNotFoundError(f"--data_dir {data_dir} does not hold the Multi30k files ({needed}). "
                                "Point it at a folder that does, or leave it out to use the default locations.")
    chosen = os.environ.get(DATA_DIR_ENV)
    if chosen:  # asked for by name, like --data_dir: never passed over for another copy
        if _complete(Path(chosen)):
            return Path(chosen)
        raise DataNotFoundError(f"${DATA_DIR_ENV}={chosen} does not hold the Multi30k files ({needed}). Point "
                                f"{DATA_DIR_ENV} at a folder that does, or unset it to use the default locations.")
    tried = candidate_dirs()
    for folder in tried:
        if _complete(folder):
            return folder
    target = REPO_ROOT / "data" / "multi30k"
    error = "downloading is switched off"
    if download:
        try:
            return download_multi30k(target, base_url)
        except OSError as exc:
            error = f"download from {base_url} failed: {exc}"
    raise DataNotFoundError(
        "Multi30k was not found in " + ", ".join(str(p) for p in tried) + f" and {error}. "
        f"Put the files ({needed}) from github.com/multi30k/dataset data/task1/raw into one of those "
        "folders, or pass --data_dir / set LLMSYS_DATA_DIR.")


def verify_multi30k(folder: Path) -> Path:
    """Read every Multi30k file of ``folder`` through, so that a damaged file is named before any
    process starts (a truncated download, a file that is not gzip).

    Raises:
        ValueError: naming the file and what to do.
    """
    for name in multi30k_files():
        path = Path(folder) / name
        try:
            with gzip.open(path, "rb") as f:
                while f.read(1 << 20):
                    pass
        except (OSError, EOFError) as exc:
            raise ValueError(f"the data file {path} is damaged ({exc}); delete it (and re-download it: the run "
                             "downloads missing files itself when it can) or point --data_dir at a good copy") from None
    return Path(folder)


def _read_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def load_multi30k(data_dir: str | os.PathLike | None = None, src_lang: str = "de", tgt_lang: str = "en"):
    """Multi30k as a ``datasets.DatasetDict`` with splits ``train``, ``validation``, ``test``.

    Each row has one column, ``translation``: ``{"de": str, "en": str}``, the layout of
    Hugging Face translation datasets.

    Raises:
        DataNotFoundError: see :func:`resolve_data_dir`.
        ValueError: a language other than de/en, or files of different lengths.
    """
    import datasets

    for lang in (src_lang, tgt_lang):
        if lang not in MULTI30K_LANGS:
            raise ValueError(f"Multi30k here has languages {MULTI30K_LANGS}, not {lang!r}")
    folder = resolve_data_dir(data_dir)
    splits = {}
    for split, stem in MULTI30K_SPLITS.items():
        de, en = (_read_lines(folder / f"{stem}.{lang}.gz") for lang in MULTI30K_LANGS)
        if len(de) != len(en):
            raise ValueError(f"{folder}/{stem}: {len(de)} German but {len(en)} English lines")
        rows = [{"de": d, "en": e} for d, e in zip(de, en)]
        splits[split] = datasets.Dataset.from_dict({"translation": rows})
    return datasets.DatasetDict(splits)


def load_translation_dataset(dataset: str = "multi30k", data_dir: str | os.PathLike | None = None,
                             src_lang: str = "de", tgt_lang: str = "en"):
    """The course corpus, or any Hugging Face dataset with a ``translation`` column.

    ``dataset="multi30k"`` reads the local files (see the module docstring). Any other
    name is passed to ``datasets.load_dataset`` (needs network access), e.g.
    ``bbaaaa/iwslt14-de-en``; its ``validation``/``test`` splits are required.

    Returns:
        ``datasets.DatasetDict`` with ``train``, ``validation``, ``test``.

    Raises:
        DataNotFoundError, ValueError: missing files, splits or columns.
    """
    if dataset == "multi30k":
        return load_multi30k(data_dir, src_lang, tgt_lang)
    import datasets

    loaded = datasets.load_dataset(dataset)
    if "validation" not in loaded and "valid" in loaded:
        loaded["validation"] = loaded.pop("valid")
    missing = [s for s in ("train", "validation", "test") if s not in loaded]
    if missing:
        raise ValueError(f"dataset {dataset!r} has no split(s) {missing}")
    if "translation" not in loaded["train"].column_names:
        raise ValueError(f"dataset {dataset!r} has no 'translation' column")
    return datasets.DatasetDict({s: loaded[s] for s in ("train", "validation", "test")})
