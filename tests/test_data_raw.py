"""Raw-data resolution, sha256 pinning, missing-file errors and the (faked) download path."""

import io
import shutil
import zipfile

import pytest

from ooospec.data import raw
from ooospec.data.raw import RawDataError, load_manifest, optional_raw_file, raw_file

MIRROR = raw.REPO_ROOT.parent / "shared" / "data"
SMALL = "api-bank/init_database/Alarm.json"
BFCL_SMALL = "bfcl/bfcl_eval-2026.3.23/BFCL_v4_live_parallel.json"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.delenv(raw.ENV_VAR, raising=False)
    raw.clear_verification_cache()
    yield
    raw.clear_verification_cache()


def test_manifest_matches_the_mirror():
    manifest = load_manifest()
    assert len(manifest) == 469
    assert manifest[SMALL].size == (MIRROR / SMALL).stat().st_size
    for relpath in ("api-bank/test-data/level-1-api.json", "toolalpaca/eval_real.json", BFCL_SMALL):
        assert raw_file(relpath, fetch=None) == MIRROR / relpath


def test_env_var_wins(monkeypatch, tmp_path):
    root = tmp_path / "mine"
    (root / SMALL).parent.mkdir(parents=True)
    shutil.copy(MIRROR / SMALL, root / SMALL)
    monkeypatch.setenv(raw.ENV_VAR, str(root))
    assert raw_file(SMALL, fetch=None) == root / SMALL
    assert raw.candidate_roots()[0] == ("$OOOSPEC_RAW_DATA", root)


def test_changed_bytes_are_rejected(tmp_path):
    (tmp_path / SMALL).parent.mkdir(parents=True)
    (tmp_path / SMALL).write_text("{}")
    with pytest.raises(RawDataError, match="sha256"):
        raw_file(SMALL, fetch=None, root=tmp_path)


def test_missing_file_error_names_file_places_and_source(tmp_path):
    with pytest.raises(RawDataError) as err:
        raw_file(SMALL, fetch=None, root=tmp_path)
    message = str(err.value)
    assert SMALL in message and str(tmp_path / SMALL) in message
    assert "raw.githubusercontent.com/AlibabaResearch/DAMO-ConvAI/483554e" in message
    with pytest.raises(KeyError):
        raw_file("api-bank/not-a-file.json", fetch=None)


def test_download_from_github_is_verified(tmp_path):
    urls = []

    def fake_fetch(url):
        urls.append(url)
        return (MIRROR / SMALL).read_bytes()

    path = raw_file(SMALL, fetch=fake_fetch, root=tmp_path)
    assert path == tmp_path / SMALL and path.read_bytes() == (MIRROR / SMALL).read_bytes()
    assert urls == [f"https://raw.githubusercontent.com/AlibabaResearch/DAMO-ConvAI/{raw.APIBANK_HEAD_COMMIT}/api-bank/init_database/Alarm.json"]


def test_download_from_the_bfcl_wheel(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        wheel.writestr("bfcl_eval/data/BFCL_v4_live_parallel.json", (MIRROR / BFCL_SMALL).read_bytes())
    urls = []

    def fake_fetch(url):
        urls.append(url)
        return buffer.getvalue()

    assert raw_file(BFCL_SMALL, fetch=fake_fetch, root=tmp_path).read_bytes() == (MIRROR / BFCL_SMALL).read_bytes()
    assert urls == ["https://files.pythonhosted.org/packages/py3/b/bfcl_eval/bfcl_eval-2026.3.23-py3-none-any.whl"]


def test_download_failure_and_bad_download_are_errors(tmp_path):
    def offline(url):
        raise OSError("network unreachable")

    with pytest.raises(RawDataError, match="download failed.*network unreachable"):
        raw_file(SMALL, fetch=offline, root=tmp_path)
    with pytest.raises(RawDataError, match="sha256"):
        raw_file("toolalpaca/eval_real.json", fetch=lambda url: b"[]", root=tmp_path)


def test_upstream_urls_cover_every_manifest_file():
    for relpath in load_manifest():
        url = raw.upstream_url(relpath)
        assert url is not None or relpath.startswith("bfcl/bfcl_eval-"), relpath


def test_optional_training_files_are_used_when_present(tmp_path):
    rel = "toolalpaca/train_data.json"
    assert optional_raw_file(rel, root=tmp_path) is None
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text("[]")
    assert optional_raw_file(rel, root=tmp_path) == tmp_path / rel  # no pinned hash: none could be obtained


def test_optional_files_change_the_data_config(monkeypatch, tmp_path):
    from ooospec.data.build import data_config

    before = data_config()
    root = tmp_path / "raw"
    shutil.copytree(MIRROR / "api-bank" / "test-data", root / "api-bank" / "test-data")
    (root / "toolalpaca").mkdir(parents=True)
    (root / "toolalpaca" / "train_data.json").write_text("[]")
    monkeypatch.setenv(raw.ENV_VAR, str(root))
    after = data_config()
    assert after["optional_files"]["toolalpaca/train_data.json"] is not None
    assert after != before
