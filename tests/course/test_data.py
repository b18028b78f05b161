"""Multi30k folder resolution, download, loading, and their error messages."""
import gzip
from pathlib import Path

import pytest

import course.data as data
from course.data import DataNotFoundError, multi30k_files, resolve_data_dir

def course_copy():
    for folder in data.candidate_dirs():
        if all((folder / f).is_file() for f in multi30k_files()):
            return folder
    pytest.fail("the course's Multi30k files are not in any default folder (expected ../shared/data/multi30k)")


def fake_multi30k(folder: Path, n=3):
    folder.mkdir(parents=True, exist_ok=True)
    for name in multi30k_files():
        with gzip.open(folder / name, "wt", encoding="utf-8") as f:
            lang = name.split(".")[-2]
            f.write("".join(f"{lang} sentence {i}\n" for i in range(n)))
    return folder


def test_explicit_folder_wins_and_a_wrong_one_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMSYS_DATA_DIR", str(fake_multi30k(tmp_path / "env")))
    mine = fake_multi30k(tmp_path / "mine")
    assert resolve_data_dir(mine) == mine
    with pytest.raises(DataNotFoundError, match="does not hold the Multi30k files"):
        resolve_data_dir(tmp_path / "empty")


def test_environment_variable_comes_before_the_default_folders(tmp_path, monkeypatch):
    env = fake_multi30k(tmp_path / "env")
    monkeypatch.setenv("LLMSYS_DATA_DIR", str(env))
    assert resolve_data_dir() == env


def test_missing_everywhere_downloads_from_the_raw_urls(tmp_path, monkeypatch):
    source = course_copy()
    monkeypatch.delenv("LLMSYS_DATA_DIR", raising=False)
    monkeypatch.setattr(data, "REPO_ROOT", tmp_path / "repo")  # no data/multi30k, no ../shared beside it
    got = resolve_data_dir(base_url=source.resolve().as_uri())  # a file:// mirror of the raw URLs
    assert got == tmp_path / "repo" / "data" / "multi30k"
    for name in multi30k_files():
        assert (got / name).read_bytes() == (source / name).read_bytes()


def test_failed_download_says_where_to_put_the_files(tmp_path, monkeypatch):
    monkeypatch.delenv("LLMSYS_DATA_DIR", raising=False)
    monkeypatch.setattr(data, "REPO_ROOT", tmp_path / "repo")
    with pytest.raises(DataNotFoundError) as info:
        resolve_data_dir(base_url=(tmp_path / "nowhere").as_uri())
    message = str(info.value)
    assert "train.de.gz" in message and "--data_dir" in message and "LLMSYS_DATA_DIR" in message
    assert "download" in message
    assert not list((tmp_path / "repo" / "data" / "multi30k").glob("*.gz")), "no partial files left"


def test_real_multi30k_loads_through_datasets():
    corpus = data.load_translation_dataset("multi30k")
    assert {k: len(v) for k, v in corpus.items()} == {"train": 29000, "validation": 1014, "test": 1000}
    first = corpus["train"][0]["translation"]
    assert set(first) == {"de", "en"} and first["de"] and first["en"]
    assert type(corpus["train"]).__module__.startswith("datasets")


def test_unknown_language_is_refused():
    with pytest.raises(ValueError, match="languages"):
        data.load_multi30k(src_lang="fr")
