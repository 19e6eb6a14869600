"""Croissant 1.1 metadata (JSON-LD) for a converted dataset: ``shardkit audit OUT --croissant FILE``.

Written from the manifests alone: every shard file (and samples sidecar) is a ``cr:FileObject`` with the sha256
and size the manifest records, each split's shard files are also ``cr:FileSet``\\ s, the class table is a record
set with its data inline, the splits are a ``cr:Split`` record set, and the samples are a record set read from a
CSV written beside FILE (``<FILE stem>-samples.csv``: key, split, index, and the shard file and row holding the
image and the label). A Croissant reader can load the class table, the splits and the sample table; it cannot
decode the images and labels inside npy/LMDB/HDF5/TFRecord shards (none of those is a Croissant encoding): it
learns which file and row hold them, and ``shardkit.open`` reads them.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..files.splitfiles import ShardFile, ShardInfo
from ..store.duplicates import row_keys
from ..store.manifest import Manifest
from ..store.publish import atomic_write_bytes

CONFORMS_TO = "http://mlcommons.org/croissant/1.1"
#: the JSON-LD context of Croissant 1.1 (as the reference implementation, mlcroissant 1.1, writes it)
CONTEXT: dict[str, Any] = {
    "@language": "en", "@vocab": "https://schema.org/", "arrayShape": "cr:arrayShape", "citeAs": "cr:citeAs",
    "column": "cr:column", "conformsTo": "dct:conformsTo", "containedIn": "cr:containedIn",
    "cr": "http://mlcommons.org/croissant/", "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"}, "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/", "examples": {"@id": "cr:examples", "@type": "@json"},
    "equivalentProperty": "cr:equivalentProperty", "extract": "cr:extract", "field": "cr:field",
    "fileProperty": "cr:fileProperty", "fileObject": "cr:fileObject", "fileSet": "cr:fileSet", "format": "cr:format",
    "includes": "cr:includes", "isArray": "cr:isArray", "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath", "key": "cr:key", "md5": "cr:md5", "parentField": "cr:parentField",
    "path": "cr:path", "recordSet": "cr:recordSet", "references": "cr:references", "regex": "cr:regex",
    "repeated": "cr:repeated", "replace": "cr:replace", "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/", "separator": "cr:separator", "source": "cr:source", "subField": "cr:subField",
    "transform": "cr:transform",
}
#: a shard file's encoding: a MIME type where one is registered, else the format's specification (as Croissant
#: asks for formats it has no name for)
ENCODINGS = {".npy": "https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html",
             ".h5": "application/x-hdf5", ".lmdb": "http://www.lmdb.tech/doc/",
             ".tfrecord": "https://www.tensorflow.org/tutorials/load_data/tfrecord",
             ".tfindex": "https://github.com/vahidk/tfrecord#creating-index-files"}
#: Croissant's split names for the usual split folders
SPLIT_URLS = {"train": "cr:TrainingSplit", "val": "cr:ValidationSplit", "validation": "cr:ValidationSplit",
              "test": "cr:TestSplit"}
SAMPLE_COLUMNS = ("key", "split", "index", "image_file", "image_row", "label_file", "label_row")


def _rel(path: Path, base: Path) -> str:
    return Path(os.path.relpath(path, base)).as_posix()


def _file_object(file: ShardFile, folder: Path, base: Path, shard: ShardInfo, split: str) -> dict[str, Any]:
    url = _rel(folder / file.name, base)
    return {"@type": "cr:FileObject", "@id": url, "name": file.name, "contentUrl": url,
            "contentSize": f"{file.bytes} B", "sha256": file.sha256,
            "encodingFormat": ENCODINGS.get(Path(file.name).suffix, "application/octet-stream"),
            "description": f"split {split}, shard {shard.index}: samples {shard.first_index}.."
                           f"{shard.first_index + shard.num_samples - 1}"}


def _role(shard: ShardInfo, role: str) -> ShardFile:
    """The file of ``shard`` holding its images (``role`` ``"images"``) or labels: npy keeps them apart, the other
    formats hold both in their first file."""
    return next((f for f in shard.files if f.name.startswith(role)), shard.files[0])


def _keys(m: Manifest, pos: int) -> list[str]:
    shard = m.shards[pos]
    if m.samples.inline is not None:
        return [str(m.samples[shard.first_index + j]["key"]) for j in range(shard.num_samples)]
    return row_keys(m.samples.rows(pos)) if shard.num_samples else []


def sample_rows(manifests: Sequence[tuple[Manifest, Path]], base: Path) -> Iterator[list[str]]:
    """One CSV row per sample (:data:`SAMPLE_COLUMNS`), split by split, shard by shard; keys from the sidecars
    (one shard's rows held at a time)."""
    for m, folder in manifests:
        for pos, shard in enumerate(m.shards):
            image, label = _role(shard, "images"), _role(shard, "labels")
            image_url, label_url = _rel(folder / image.name, base), _rel(folder / label.name, base)
            for j, key in enumerate(_keys(m, pos)):
                yield [key, m.split, str(shard.first_index + j), image_url, str(j), label_url, str(j)]


class _Hashed:
    """Chunks of a CSV as they are written, with their sha256 and size."""

    def __init__(self, rows: Iterator[list[str]], chunk: int = 4096) -> None:
        self.rows, self.chunk = rows, chunk
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def __iter__(self) -> Iterator[bytes]:
        done = False
        while not done:
            text = io.StringIO()
            writer = csv.writer(text, lineterminator="\n")
            for _ in range(self.chunk):
                row = next(self.rows, None)
                if row is None:
                    done = True
                    break
                writer.writerow(row)
            data = text.getvalue().encode("utf-8")
            self.sha256.update(data)
            self.bytes += len(data)
            yield data


def write_croissant(manifests: Sequence[tuple[Manifest, Path]], path: Path, name: str) -> tuple[Path, Path]:
    """Write ``path`` (Croissant JSON-LD) and its sample table ``<stem>-samples.csv`` beside it, each whole or not
    at all; → both paths. ``manifests``: each split's manifest and folder (one output, one class table)."""
    base = path.resolve().parent
    table = path.with_name(f"{path.stem}-samples.csv")
    chunks = _Hashed(itertools.chain([list(SAMPLE_COLUMNS)], sample_rows(manifests, base)))
    atomic_write_bytes(table, chunks)
    doc = metadata(manifests, base, name, table, chunks.sha256.hexdigest(), chunks.bytes)
    atomic_write_bytes(path, (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    return path, table


def metadata(manifests: Sequence[tuple[Manifest, Path]], base: Path, name: str, table: Path, table_sha256: str,
             table_bytes: int) -> dict[str, Any]:
    """The Croissant 1.1 JSON-LD document (see the module's docstring)."""
    first = manifests[0][0]
    distribution: list[dict[str, Any]] = []
    for m, folder in manifests:
        members = []
        for shard in m.shards:
            for f in shard.all_files:
                distribution.append(_file_object(f, Path(folder), base, shard, m.split))
                members.append(f.name)
        patterns = sorted({f"{n.split('-')[0]}-*{Path(n).suffix}" if "-" in n else n for n in members})
        distribution.append({"@type": "cr:FileSet", "@id": f"{m.split}-shards", "name": f"{m.split}-shards",
                             "description": f"the shard files and samples sidecars of split {m.split} "
                                            f"({m.format}, {m.num_samples} samples)",
                             "encodingFormat": sorted({ENCODINGS.get(Path(n).suffix, "application/octet-stream")
                                                       for n in members}),
                             "includes": [_rel(Path(folder) / p, base) for p in patterns]})
    table_url = _rel(table.resolve(), base)
    distribution.append({"@type": "cr:FileObject", "@id": "samples-table", "name": table.name,
                         "contentUrl": table_url, "contentSize": f"{table_bytes} B", "sha256": table_sha256,
                         "encodingFormat": "text/csv",
                         "description": "one row per sample: its key, split, index in the split, and the shard "
                                        "file and row holding its image and its label"})
    classes = first.classes.classes  # in id order (ClassTable checks it)
    ignore = first.classes.ignore_index

    def field(record: str, key: str, kind: str, description: str, column: str | None = None,
              references: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"@type": "cr:Field", "@id": f"{record}/{key}", "name": key,
                               "description": description, "dataType": kind}
        if column is not None:
            out["source"] = {"fileObject": {"@id": "samples-table"}, "extract": {"column": column}}
        if references is not None:
            out["references"] = {"field": {"@id": references}}
        return out

    record_sets = [
        {"@type": "cr:RecordSet", "@id": "classes", "name": "classes", "key": {"@id": "classes/id"},
         "description": f"the class table ({first.classes.source or 'unrecorded source'}); label pixels "
                        "hold these ids" + (f"; id {ignore} is the ignore index" if ignore is not None else ""),
         "field": [field("classes", "id", "sc:Integer", "the class id stored in the label pixels"),
                   field("classes", "name", "sc:Text", "the class name"),
                   field("classes", "colour", "sc:Text", "the class colour as #rrggbb (empty where the source "
                                                         "gave none)")],
         "data": [{"classes/id": c.id, "classes/name": c.name,
                   "classes/colour": "#" + "".join(f"{v:02x}" for v in c.colour) if c.colour else ""}
                  for c in classes]},
        {"@type": "cr:RecordSet", "@id": "splits", "name": "splits", "dataType": "cr:Split",
         "key": {"@id": "splits/name"}, "description": "the splits of the dataset",
         "field": [field("splits", "name", "sc:Text", "the split's name (its folder)"),
                   field("splits", "url", "sc:Text", "the split's kind")],
         "data": [{"splits/name": m.split, "splits/url": SPLIT_URLS.get(m.split, f"cr:{m.split}")}
                  for m, _ in manifests]},
        {"@type": "cr:RecordSet", "@id": "samples", "name": "samples", "key": {"@id": "samples/key"},
         "description": "every sample: the image and its label (class ids, the classes record set) are arrays inside "
                        "the shard files named here, at the row given; shardkit.open reads them",
         "field": [field("samples", "key", "sc:Text", "the sample's key (its image path in the input)", "key"),
                   field("samples", "split", "sc:Text", "the split holding the sample", "split", "splits/name"),
                   field("samples", "index", "sc:Integer", "the sample's index in its split", "index"),
                   field("samples", "image_file", "sc:Text", "the shard file holding the image", "image_file"),
                   field("samples", "image_row", "sc:Integer", "the image's row in that shard", "image_row"),
                   field("samples", "label_file", "sc:Text", "the shard file holding the label", "label_file"),
                   field("samples", "label_row", "sc:Integer", "the label's row in that shard", "label_row")]},
    ]
    spec = first.sample
    return {
        "@context": CONTEXT, "@type": "sc:Dataset", "conformsTo": CONFORMS_TO, "name": name,
        "description": f"segmentation dataset converted by shardkit {first.tool_version}: {len(manifests)} split(s), "
                       f"{sum(m.num_samples for m, _ in manifests)} samples in {first.format} shards; images "
                       f"{list(spec.image_dims)} {spec.image_dtype}, labels {spec.label_encoding} "
                       f"{spec.stored_label_dtype.str}, {len(classes)} classes",
        "url": Path(base).as_uri(), "version": f"{max(m.version or 1 for m, _ in manifests)}.0.0",
        "distribution": distribution, "recordSet": record_sets,
    }
