"""Open augmentation ops: each op's kind, parameter record and output spec; each backend's kernel table refusing an
op it has no kernel for; the host-side packing shared by torch and TF; no op needing a backend."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardkit
from shardkit import augment as A
from shardkit.augment import ops as O
from shardkit.augment import packing
from shardkit.errors import ConfigError

IGNORE = 11
SPEC = "scale=0.5:2,crop=128x160,hflip,rotate=10,jitter=0.2:0.2:0.3:0.05,cutout=0-3:16x24:ignore"


@pytest.fixture(scope="module")
def data(camvid_val_npy: Path) -> tuple[np.ndarray, np.ndarray]:
    ds = shardkit.open(camvid_val_npy)
    return ds.batch(np.arange(6))


class Posterize(O.Op):
    """A photometric op that no backend has a kernel for."""

    def draw(self, rng: np.random.Generator, st: O._State) -> None:
        st.record(O.JitterParams())


class Speckle(O.Op):
    """A mask op that no backend has a kernel for."""

    kind = O.Kind.MASK

    def draw(self, rng: np.random.Generator, st: O._State) -> None:
        st.record(O.CutoutParams())


@dataclasses.dataclass(frozen=True)
class VFlipParams(O.OpParams):
    flip: bool = False


class VFlip(O.Op):
    """A user's geometric op: mirror top-bottom. Geometric ops need no kernel: they join the fused matrix."""

    kind = O.Kind.GEOMETRIC

    def draw(self, rng: np.random.Generator, st: O._State) -> None:
        flip = bool(rng.random() < 0.5)
        if flip:
            st.then(np.array([[1.0, 0, 0], [0, -1, st.hw[0] - 1], [0, 0, 1]]))
        st.record(VFlipParams(flip))


def _backends(tf: Any) -> dict[str, Any]:
    import torch

    from shardkit.augment.tf import apply_batch as tf_apply
    from shardkit.augment.torch import apply_batch as torch_apply

    def numpy_path(aug: A.Compose, images: np.ndarray, labels: np.ndarray, idx: Any, **kw: Any) -> tuple:
        return aug(images, labels, idx, **kw)

    def torch_path(aug: A.Compose, images: np.ndarray, labels: np.ndarray, idx: Any, **kw: Any) -> tuple:
        img, lab = torch_apply(aug, torch.from_numpy(images), torch.from_numpy(labels), idx, **kw)
        return img.numpy(), lab.numpy()

    def tf_path(aug: A.Compose, images: np.ndarray, labels: np.ndarray, idx: Any, **kw: Any) -> tuple:
        img, lab = tf_apply(aug, images, labels, idx, **kw)
        return img.numpy(), lab.numpy()

    return {"numpy": numpy_path, "torch": torch_path, "tf": tf_path}


def test_every_op_declares_its_kind_record_and_output_spec() -> None:
    aug = A.Compose([*A.parse(SPEC).ops, A.Normalize((1, 2, 3), (4, 5, 6)), A.OneHot(12)])
    kinds = [op.kind for op in aug.ops]
    assert kinds == [O.Kind.GEOMETRIC] * 4 + [O.Kind.PHOTOMETRIC, O.Kind.MASK, O.Kind.OUTPUT, O.Kind.OUTPUT]
    p = aug.params(3, seed=1, epoch=2, hw=(360, 480))
    assert [type(r) for r in p.records] == [O.ScaleParams, O.CropParams, O.FlipParams, O.RotateParams,
                                            O.JitterParams, O.CutoutParams]  # one record per drawing op, its own
    assert p.records[4] == aug.records([p], 4)[0]
    assert aug.output_spec(O.BatchSpec()) == O.BatchSpec(channels=3, image_dtype="float32", labels="onehot")
    # the flat fields of earlier releases read (and build) the records
    assert (p.scale, p.angle, p.crop_offset, p.holes) == (p.records[0].scale, p.records[3].angle,
                                                          p.records[1].offset, p.records[5].holes)
    assert O.Params(matrix=p.matrix, out_hw=p.out_hw, records=p.records[:4], brightness=p.brightness,
                    contrast=p.contrast, saturation=p.saturation, hue=p.hue).records == p.records[:5]
    with pytest.raises(TypeError, match="unexpected keyword"):
        O.Params(matrix=p.matrix, out_hw=p.out_hw, gamma=1.0)


def test_ops_that_cannot_take_the_data_say_so() -> None:
    with pytest.raises(ConfigError, match="saturation and hue mean something for RGB images only"):
        A.parse("jitter=0.1:0.1:0.2").output_spec(O.BatchSpec(channels=4))
    A.parse("jitter=0.1:0.1").output_spec(O.BatchSpec(channels=4))  # brightness/contrast are per band
    with pytest.raises(ConfigError, match="3 means and stds, the images 4 channels"):
        A.Compose([A.Normalize((1, 2, 3), (1, 1, 1))]).output_spec(O.BatchSpec(channels=4))


def test_the_packed_arrays_are_what_the_layout_states() -> None:
    aug = A.Compose([*A.parse(SPEC).ops, A.Normalize((1, 2, 3), (4, 5, 6))])
    params = aug.params_batch(range(5), seed=2, hws=[(360, 480)] * 5)
    packed = packing.pack(aug, params)
    names = [name for name, _, _ in packing.layout(aug)]
    assert list(packed) == names == ["mats", "4.lut", "4.bc", "4.sat", "4.shift", "5.boxes",
                                                "6.constants"]
    for name, dtype, shape in packing.layout(aug):
        arr = packed[name]
        assert arr.dtype == np.dtype(dtype) and arr.ndim == len(shape)
        assert all(d is None or arr.shape[i] == (5 if d == "B" else d) for i, d in enumerate(shape))
    assert packing.of(packed, 4).keys() == {"lut", "bc", "sat", "shift"}
    np.testing.assert_array_equal(packed["4.shift"], [round(p.hue * 180) for p in params])
    for k, p in enumerate(params):
        assert [tuple(b) for b in packed["5.boxes"][k] if b[2] > b[0]] == list(p.holes)


def test_an_op_that_packs_what_its_layout_does_not_state_is_refused() -> None:
    class Bad(O.Op):
        def draw(self, rng: np.random.Generator, st: O._State) -> None:
            st.record(O.JitterParams())

        def layout(self) -> dict:
            return {"x": ("uint8", ("B",))}

        def pack(self, records: Any) -> dict:
            return {"x": np.zeros(len(records), np.float32)}

    aug = A.Compose([Bad()])
    with pytest.raises(ConfigError, match=r"Bad\.pack gave 'x' float32"):
        packing.pack(aug, aug.params_batch([0], hws=[(4, 4)]))


@pytest.mark.parametrize("backend", ["numpy", "torch", "tf"])
@pytest.mark.parametrize("op", [Posterize(), Speckle()], ids=["photometric", "mask"])
def test_every_backend_refuses_an_op_it_has_no_kernel_for(tf, data: tuple, backend: str, op: O.Op) -> None:
    run = _backends(tf)[backend]
    aug = A.Compose([A.RandomCrop(64, 64), op])
    with pytest.raises(ConfigError) as err:
        run(aug, data[0][:2], data[1][:2], [0, 1], seed=0, epoch=0, ignore_index=IGNORE)
    msg = str(err.value)
    assert "\n" not in msg and f"does not apply {type(op).__name__}" in msg and "no kernel" in msg
    assert f"({op.kind.value} op)" in msg


def test_a_new_geometric_op_needs_no_kernel_and_agrees_on_every_backend(tf, data: tuple) -> None:
    images, labels = data
    aug = A.Compose([A.RandomScale(0.7, 1.3), A.RandomCrop(120, 160), VFlip(), A.RandomFlip()])
    idx = np.arange(len(images))
    flips = [aug.params(int(i), seed=5, epoch=1, hw=(360, 480)).get(VFlipParams) for i in idx]
    assert {f.flip for f in flips if f is not None} == {True, False}
    out = {name: run(aug, images, labels, idx, seed=5, epoch=1, ignore_index=IGNORE)
           for name, run in _backends(tf).items()}
    for name in ("torch", "tf"):
        np.testing.assert_array_equal(out[name][1], out["numpy"][1])
        assert np.abs(out[name][0].astype(np.int16) - out["numpy"][0]).max() <= 1


def test_no_op_and_no_geometry_code_imports_a_backend() -> None:
    """ops.py, geometry.py and packing.py sit below every backend: no import of cv2, torch, tensorflow or the
    backend modules, at module level or inside a function."""
    root = Path(O.__file__).parent
    for name in ("ops.py", "geometry.py", "packing.py"):
        tree = ast.parse((root / name).read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                found |= {(node.module or "").split(".")[0]} | {a.name for a in node.names}
        assert not found & {"cv2", "torch", "tensorflow", "cpu", "tf"}, (name, found)
