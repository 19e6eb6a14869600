"""Walking the input tree: folder links that leave the input folder are not followed (a link in ``images/`` to
``/usr/share`` or ``/sys`` was walked whole, issue #36); links inside it, and links to files, still are."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

import shardkit.conversion.layouts.scan
from shardkit.conversion.layouts import discover
from shardkit.errors import LayoutError
from tests.camvid_copy import small_camvid


def keys(root: Path) -> list[str]:
    return sorted(p.key for p in discover(root).splits["val"])


@pytest.fixture()
def raw(camvid_root: Path, tmp_path: Path) -> Path:
    return small_camvid(camvid_root, tmp_path / "raw", 3)


@pytest.fixture()
def elsewhere(camvid_root: Path, tmp_path: Path) -> Path:
    """Two more CamVid pairs in a folder outside the input tree, one level down (``images/deep``, ``labels/deep``)."""
    out = tmp_path / "elsewhere"
    names = sorted(p.name for p in (camvid_root / "val").glob("*.png"))[10:12]
    for sub, dst in (("val", "images/deep"), ("valannot", "labels/deep")):
        (out / dst).mkdir(parents=True)
        for name in names:
            shutil.copyfile(camvid_root / sub / name, out / dst / name)
    return out


def test_a_folder_link_out_of_the_input_is_not_walked(raw: Path, elsewhere: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    (raw / "val" / "more").symlink_to(elsewhere / "images")
    (raw / "valannot" / "more").symlink_to(elsewhere / "labels")
    with caplog.at_level(logging.WARNING, "shardkit"):
        found = keys(raw)
    assert len(found) == 3 and not any("more" in k for k in found), found
    warned = [r.getMessage() for r in caplog.records if "outside the input folder" in r.getMessage()]
    assert len(warned) == 2, caplog.text
    assert f"{raw / 'val' / 'more'}: not read, it is a symbolic link to {elsewhere / 'images'}" in warned[0] + warned[1]
    assert all("fix:" in w for w in warned)


def test_a_folder_link_inside_the_input_is_walked(raw: Path, elsewhere: Path) -> None:
    shutil.move(elsewhere, raw / ".pool")  # now inside the input folder (hidden: no layout looks at it)
    (raw / "val" / "more").symlink_to(raw / ".pool" / "images")
    (raw / "valannot" / "more").symlink_to(Path("..") / ".pool" / "labels")  # a relative link too
    found = keys(raw)
    assert len(found) == 5 and sum(k.startswith("val/more/deep/") for k in found) == 2, found


def test_a_file_link_out_of_the_input_is_still_followed(raw: Path, elsewhere: Path) -> None:
    """A symlink farm: files linked from anywhere are inputs (read and checked as regular files when read)."""
    for sub, src in (("val", "images"), ("valannot", "labels")):
        for p in (elsewhere / src / "deep").iterdir():
            (raw / sub / p.name).symlink_to(p)
    assert len(keys(raw)) == 5


@pytest.mark.parametrize("target", ["/sys", "/usr/share", "/"])
def test_a_link_to_a_system_folder_is_never_walked(raw: Path, target: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if not Path(target).is_dir():
        pytest.skip(f"no {target} here")
    listed: list[str] = []
    real = shardkit.conversion.layouts.scan.scan

    def scan(folder: Path) -> tuple[list[str], object]:
        listed.append(os.path.realpath(folder))
        return real(folder)  # type: ignore[return-value]

    monkeypatch.setattr(shardkit.conversion.layouts.scan, "scan", scan)
    (raw / "val" / "system").symlink_to(target)
    assert len(keys(raw)) == 3
    inside = os.path.realpath(raw)
    assert listed and all(p == inside or p.startswith(inside + os.sep) for p in listed), \
        [p for p in listed if not p.startswith(inside)][:5]


def test_the_layout_folder_itself_linked_out_of_the_input_is_not_walked(raw: Path, tmp_path: Path) -> None:
    """``valannot`` → the same labels in a folder elsewhere: the rule holds for the folders a layout names too;
    the run then finds no labels, and says which link it did not follow."""
    shutil.move(raw / "valannot", tmp_path / "labels-elsewhere")
    (raw / "valannot").symlink_to(tmp_path / "labels-elsewhere")
    with pytest.raises(LayoutError, match="no image/label pairs"):
        keys(raw)


def test_unread_file_types_are_named_with_what_would_read_them(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A volume (.nii.gz counted whole, not as .gz) and annotation JSON beside mask images: each type is named
    with its reason, in the log and in the discovery report."""
    isbi = Path(__file__).resolve().parents[2] / "data" / "isbi-em"
    for folder, src in (("images", "image"), ("labels", "label")):
        (tmp_path / folder).mkdir()
        shutil.copyfile(isbi / src / "0.png", tmp_path / folder / "0.png")
    for i in range(2):
        (tmp_path / "labels" / f"case_{i}.nii.gz").write_bytes(b"\x1f\x8b")
    (tmp_path / "images" / "0.json").write_text("{}")
    with caplog.at_level(logging.WARNING):
        found = discover(tmp_path)
    assert found.skipped_types == {".nii.gz": 2, ".json": 1}
    said = " ".join(found.report_lines()) + caplog.text
    assert "2 .nii.gz (3-D volumes are read in nnU-Net/MSD and per-case-folder trees only (docs/volumes.md)" in said
    assert "1 .json (annotation files (COCO, labelme …) are not mask images" in said


def test_per_instance_mask_folders_fix_followed_pairs_each_sample_with_its_label(tmp_path: Path) -> None:
    """Following the refusal's fix (one label.png per sample, the two templates) pairs every sample exactly."""
    isbi = Path(__file__).resolve().parents[2] / "data" / "isbi-em"
    for sample in ("a1", "b2"):
        (tmp_path / sample / "images").mkdir(parents=True)
        (tmp_path / sample / "masks").mkdir()
        shutil.copyfile(isbi / "image" / "0.png", tmp_path / sample / "images" / f"{sample}.png")
        shutil.copyfile(isbi / "label" / "0.png", tmp_path / sample / "masks" / "m0.png")
        shutil.copyfile(isbi / "label" / "1.png", tmp_path / sample / "label.png")
    found = discover(tmp_path, images="{name}/images/*.png", labels="{name}/label.png")
    pairs = found.splits["all"]
    assert len(pairs) == 2
    assert [(p.image.name, p.label.parent.name, p.label.name) for p in pairs] == [
        ("a1.png", "a1", "label.png"), ("b2.png", "b2", "label.png")]


def test_an_image_tree_deeper_than_counted_is_named_not_0_images(tmp_path: Path) -> None:
    """Images four folders down (ADE20K-like scene folders under an unknown name): the no-layout message says the
    tree goes deeper than it counted, instead of "0 images"."""
    isbi = Path(__file__).resolve().parents[2] / "data" / "isbi-em"
    deep = tmp_path / "photos" / "split" / "a" / "scene" / "sub"
    deep.mkdir(parents=True)
    shutil.copyfile(isbi / "image" / "0.png", deep / "0.png")
    with pytest.raises(LayoutError) as info:
        discover(tmp_path)
    assert "photos/ (0+ images in its first 3 levels, more folders below)" in str(info.value)
