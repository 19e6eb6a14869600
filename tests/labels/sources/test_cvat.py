"""The CVAT for images 1.1 source: polygons and boxes bit-exact with pycocotools' frPyObjects (the rule of
datumaro, on which CVAT's mask export runs), masks by CVAT's row-major RLE, z_order on top, polylines counted as
degenerate; entity declarations and hostile shapes refused in one line. Synthetic files (edge cases)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardkit.errors import LabelError
from shardkit.labels.sources import registry
from shardkit.labels.sources.base import Policies, rasterise
from shardkit.labels.sources.cvat import CvatSource

mask_utils = pytest.importorskip("pycocotools.mask")
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

H, W = 40, 50
MASK_BITS = np.zeros((6, 8), dtype=bool)
MASK_BITS[1:5, 2:7] = True
MASK_BITS[2:4, 4] = False  # a hole


def rle_of(bits: np.ndarray) -> str:
    """CVAT's RLE: runs over the box in row-major order, starting with 0."""
    flat = bits.ravel().astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    return ", ".join(str(c) for c in np.diff(np.concatenate([[0], edges])).tolist())


SHAPES = f"""
    <polygon label="road" occluded="0" points="2.5,3.2;30.1,4.0;28.7,25.9;4.2,22.0" z_order="2"/>
    <box label="car" occluded="1" xtl="10.4" ytl="8.6" xbr="22.2" ybr="18.9" z_order="0"/>
    <polygon label="car" occluded="0" points="40,30;55,35;45,45" z_order="1"/>
    <mask label="person" rle="{rle_of(MASK_BITS)}" left="44" top="36" width="8" height="6" z_order="3"/>
    <polyline label="road" points="1,1;5,5;9,1" z_order="5"/>
"""


def xml(shapes: str = SHAPES, head: str = "", name: str = "a.png") -> str:
    return f"""<?xml version="1.0" encoding="utf-8"?>{head}
<annotations>
  <version>1.1</version>
  <meta><task><labels>
    <label><name>road</name></label><label><name>car</name></label><label><name>person</name></label>
  </labels></task></meta>
  <image id="0" name="{name}" width="{W}" height="{H}">{shapes}</image>
</annotations>
"""


def tree(root: Path, text: str) -> Path:
    (root / "images").mkdir(parents=True)
    Image.fromarray(np.zeros((H, W, 3), np.uint8)).save(root / "images" / "a.png")
    (root / "annotations.xml").write_text(text)
    return root.resolve()


def reference() -> np.ndarray:
    """An independent reading: pycocotools frPyObjects per polygon/box, the RLE decoded row-major, painted in
    z_order (stable), background 0, classes road 1, car 2, person 3."""
    def poly(points: list[float]) -> np.ndarray:
        return mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects([points], H, W))).astype(bool)

    box = [10.4, 8.6, 22.2, 8.6, 22.2, 18.9, 10.4, 18.9]
    full = np.zeros((H, W), dtype=bool)
    full[36:40, 44:50] = MASK_BITS[:4, :6]
    layers = [(0, 2, poly(box)), (1, 2, poly([40, 30, 55, 35, 45, 45])),
              (2, 1, poly([2.5, 3.2, 30.1, 4.0, 28.7, 25.9, 4.2, 22.0])), (3, 3, full)]
    out = np.zeros((H, W), dtype=np.int64)
    for _, cls, m in sorted(layers, key=lambda t: t[0]):
        out[m] = cls
    return out


def read(root: Path) -> tuple[np.ndarray, object]:
    notes = CvatSource().read(root, root / "annotations.xml")
    ((_, sample),) = notes.splits["all"]
    return rasterise(CvatSource(), sample, H, W, notes.table, Policies(CvatSource.overlap, "class"))


def test_shapes_by_z_order_bit_exact(tmp_path: Path) -> None:
    root = tree(tmp_path / "cvat", xml())
    assert registry.detect(root) == [(CvatSource, root / "annotations.xml")]
    notes = CvatSource().read(root, root / "annotations.xml")
    assert [c.name for c in notes.table.classes] == ["background", "road", "car", "person"]
    assert CvatSource.overlap == "z-order"
    ids, report = read(root)
    np.testing.assert_array_equal(ids, reference())
    assert report.degenerate == 1 and report.clipped == 2 and report.painted_over > 0  # type: ignore[attr-defined]


def test_file_order_differs_from_z_order(tmp_path: Path) -> None:
    root = tree(tmp_path / "cvat", xml())
    notes = CvatSource().read(root, root / "annotations.xml")
    ((_, sample),) = notes.splits["all"]
    ids, _ = rasterise(CvatSource(), sample, H, W, notes.table, Policies("order", "class"))
    assert not np.array_equal(ids, reference())  # the road polygon (z 2) is under the car box in file order


@pytest.mark.parametrize(("head", "needle"), [
    ('<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;">]>', "DOCTYPE or ENTITY"),
    ('<!DOCTYPE a [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>', "DOCTYPE or ENTITY"),
])
def test_entity_declarations_are_refused(tmp_path: Path, head: str, needle: str) -> None:
    root = tree(tmp_path / "cvat", xml(head=head))
    with pytest.raises(LabelError, match=needle):
        read(root)


@pytest.mark.parametrize(("shapes", "needle"), [
    ('<polygon label="road" points="1,2;nan,4;6,5"/>', "not a finite number|nan|NaN"),
    ('<polygon label="tree" points="1,2;3,4;6,5"/>', "label 'tree'"),
    ('<mask label="car" rle="3, 4" left="0" top="0" width="4" height="4"/>', "do not sum"),
    ('<ellipse label="car" cx="3" cy="3" rx="2" ry="2"/>', "<ellipse>"),
    ('<box label="car" xtl="inf" ytl="0" xbr="3" ybr="3"/>', "xtl='inf'"),
    ('<polygon label="road" points="1,2;3"/>', "x,y pair"),
    ('<box label="car" xtl="1" ytl="1" xbr="9" ybr="9" rotation="30.00"/>', "rotated"),
])
def test_hostile_shapes_are_refused_in_one_line(tmp_path: Path, shapes: str, needle: str) -> None:
    root = tree(tmp_path / "cvat", xml(shapes))
    with pytest.raises(LabelError, match=needle) as err:
        read(root)
    assert "\n" not in str(err.value)


def test_image_outside_the_input_is_refused(tmp_path: Path) -> None:
    root = tree(tmp_path / "cvat", xml(name="../../etc/passwd"))
    with pytest.raises(LabelError, match="outside the input folder"):
        read(root)
