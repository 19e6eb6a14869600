"""Built-in class tables: CamVid SegNet, PASCAL VOC, Cityscapes."""

from __future__ import annotations

from shardkit.labels import CAMVID_SEGNET, CITYSCAPES, CITYSCAPES_LABEL_IDS, VOC, ClassInfo, voc_colormap

# --------------------------------------------------------------------------- built-in tables


def test_camvid_segnet_table_matches_the_data_readme() -> None:
    names = [c.name for c in CAMVID_SEGNET.classes]
    assert names == [
        "Sky", "Building", "Pole", "Road", "Pavement", "Tree", "SignSymbol", "Fence", "Car", "Pedestrian",
        "Bicyclist", "Unlabelled",
    ]  # fmt: skip
    assert CAMVID_SEGNET.ignore_index == 11
    assert CAMVID_SEGNET.classes[0].colour == (128, 128, 128)
    assert CAMVID_SEGNET.classes[4].colour == (60, 40, 222)
    assert CAMVID_SEGNET.classes[11].colour == (0, 0, 0)


def test_voc_table_uses_the_standard_colormap() -> None:
    assert VOC.num_classes == 21 and VOC.ignore_index == 255
    assert VOC.classes[0] == ClassInfo(0, "background", (0, 0, 0))
    assert VOC.classes[1] == ClassInfo(1, "aeroplane", (128, 0, 0))
    assert VOC.classes[15] == ClassInfo(15, "person", (192, 128, 128))
    assert VOC.classes[20] == ClassInfo(20, "tvmonitor", (0, 64, 128))
    assert tuple(voc_colormap()[255]) == (224, 224, 192)


def test_cityscapes_table_has_19_train_ids_and_the_official_remap() -> None:
    assert CITYSCAPES.num_classes == 19 and CITYSCAPES.ignore_index == 255
    assert CITYSCAPES.classes[0] == ClassInfo(0, "road", (128, 64, 128))
    assert CITYSCAPES.classes[18] == ClassInfo(18, "bicycle", (119, 11, 32))
    remap = CITYSCAPES.remap
    assert remap is not None and len(remap) == 256
    assert (remap[7], remap[8], remap[26], remap[33]) == (0, 1, 13, 18)
    assert remap[0] == remap[1] == remap[6] == remap[9] == remap[29] == 255
    assert remap[255] == 255  # labelId -1 (license plate) as a uint8
    assert all(v == 255 for v in remap[34:])
    assert CITYSCAPES_LABEL_IDS.num_classes == 34 and CITYSCAPES_LABEL_IDS.remap is None
