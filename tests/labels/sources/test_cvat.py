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
    ('<polygon label="road" points="1,2;3,4;6,5" rotation="30.00"/>', "rotated"),
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


# --- real exports (tests/data/cvat-xml, see tests/data/README.md) ---------------------------------------------------

REAL = Path(__file__).resolve().parents[2] / "data" / "cvat-xml"
#: three images of the app.cvat.ai project export: 1, 2 and 3 rotated boxes among masks and boxes
URBAN = ("benjamin-sow-5hQMCo5qtSs-unsplash.jpg", "chris-kursikowski-FavVDBvOm2A-unsplash.jpg",
         "junshen-zeng-Ja6U9f8VIj8-unsplash.jpg")


def urban_tree(root: Path) -> Path:
    """The real export beside a placeholder file per image it names: the labels depend only on the size the XML
    gives each image (rasterise is given it), and 20 photos of up to 5760x7150 would be 100+ MB."""
    import xml.etree.ElementTree as ET

    root.mkdir()
    src = REAL / "urban-scene" / "annotations.xml"
    (root / "annotations.xml").write_bytes(src.read_bytes())
    for im in ET.parse(src).getroot().iter("image"):
        (root / im.get("name", "")).write_bytes(b"")
    return root.resolve()


def cvat_reading(image: object, labels: list[str]) -> np.ndarray:
    """An independent reading of one <image> by CVAT's documented export rule: masks through pycocotools as
    CVAT's MaskConverter decodes them (the runs as a column-major RLE of the transposed box), boxes as their
    corners turned about the centre (a rotation matrix), filled by pycocotools' frPyObjects; rotated boxes
    after the image's other shapes, then a stable sort by z_order, later on top; tags and attributes ignored."""
    h, w = int(image.get("height")), int(image.get("width"))  # type: ignore[attr-defined]
    layers: list[tuple[int, int, int, int, np.ndarray]] = []
    for n, el in enumerate(image):  # type: ignore[attr-defined]
        if el.tag == "tag":
            continue
        cls = labels.index(el.get("label")) + 1
        full = np.zeros((h, w), dtype=bool)
        rotated = 0
        if el.tag == "mask":
            left, top, bw, bh = (int(el.get(k)) for k in ("left", "top", "width", "height"))
            counts = [int(c) for c in el.get("rle").split(",")]
            rle = mask_utils.frPyObjects([{"counts": counts, "size": [bw, bh]}], bh, bw)[0]
            full[top:top + bh, left:left + bw] = mask_utils.decode(rle).T.astype(bool)
        else:
            x0, y0, x1, y1 = (float(el.get(k)) for k in ("xtl", "ytl", "xbr", "ybr"))
            corners = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]])
            a = np.deg2rad(float(el.get("rotation", "0")))
            rotated = int(a != 0)
            centre = np.array([(x0 + x1) / 2, (y0 + y1) / 2])
            turn = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
            points = ((corners - centre) @ turn.T + centre).ravel().tolist()
            full = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects([points], h, w))).astype(bool)
        layers.append((int(el.get("z_order", "0")), rotated, n, cls, full))
    out = np.zeros((h, w), dtype=np.int64)
    for _, _, _, cls, full in sorted(layers, key=lambda t: t[:3]):
        out[full] = cls
    return out


def test_real_cvat_export_with_rotated_boxes_bit_exact(tmp_path: Path) -> None:
    """A real app.cvat.ai "CVAT for images 1.1" project export (masks, boxes, 20 rotated boxes, tags,
    attributes): its labels equal the independent reading of CVAT's rule, pixel for pixel."""
    import xml.etree.ElementTree as ET

    root = urban_tree(tmp_path / "urban")
    assert registry.detect(root) == [(CvatSource, root / "annotations.xml")]
    notes = CvatSource().read(root, root / "annotations.xml")
    doc = ET.parse(root / "annotations.xml").getroot()
    labels = [el.findtext("name") for el in doc.findall("./meta/*/labels/label")]
    assert [c.name for c in notes.table.classes] == ["background", *labels]
    samples = {s.key: s for _, s in notes.splits["all"]}
    assert len(samples) == 20
    rotated_seen = 0
    for im in doc.iter("image"):
        if im.get("name") not in URBAN:
            continue
        sample = samples[im.get("name", "")]
        rotated_seen += sum(1 for el in im if el.get("rotation"))
        ids, report = rasterise(CvatSource(), sample, sample.height, sample.width, notes.table,
                                Policies(CvatSource.overlap, "class"))
        np.testing.assert_array_equal(ids, cvat_reading(im, labels), err_msg=im.get("name"))
        assert not report.degenerate  # type: ignore[attr-defined]
    assert rotated_seen == 6


def test_rotated_box_is_painted_after_the_other_shapes(tmp_path: Path) -> None:
    """CVAT's export moves a rotated box after the image's other shapes: under the same z_order it covers a mask
    that comes later in the file (file order alone would put the mask on top)."""
    bits = np.ones((10, 10), dtype=bool)
    shapes = ('<box label="car" xtl="5" ytl="5" xbr="25" ybr="25" rotation="10.0" z_order="0"/>'
              f'<mask label="person" rle="{rle_of(bits)}" left="10" top="10" width="10" height="10" z_order="0"/>')
    root = tree(tmp_path / "cvat", xml(shapes))
    ids, _ = read(root)
    assert (ids[12:18, 12:18] == 2).all()  # the car (rotated box) on top of the person mask


def test_video_export_is_refused_in_one_line(tmp_path: Path) -> None:
    """datumaro's real "CVAT for video 1.1" sample (tracks with outside/keyframe): refused, naming the export to
    use."""
    root = tmp_path / "video"
    root.mkdir()
    (root / "annotations.xml").write_bytes((REAL / "datumaro-video" / "annotations.xml").read_bytes())
    with pytest.raises(LabelError, match=r"CVAT for video 1\.1.*3 <track>.*CVAT for images 1\.1") as err:
        CvatSource().read(root.resolve(), root / "annotations.xml")
    assert "\n" not in str(err.value)


def test_grouped_shapes_are_refused(tmp_path: Path) -> None:
    root = tree(tmp_path / "cvat", xml('<polygon label="road" points="1,2;30,4;6,25" group_id="3"/>'))
    with pytest.raises(LabelError, match=r"group 3.*ungroup"):
        read(root)
