"""tf.data adapter: ``shardkit.tf.dataset("out/train", batch_size=8)`` → a ``tf.data.Dataset`` of batches.

Importing this module imports TensorFlow; ``import shardkit`` does not. It never imports the
``tfrecord`` package (its protobufs clash with TensorFlow's in one process).

TFRecord splits are read by TensorFlow itself: this rank's part of the shard stream (shards
in an order permuted per seed and epoch, see :func:`shardkit.read.sampling.stream_ranges`)
is interleaved across files, shuffled through a buffer, **batched before parsing**
(one vectorised ``tf.io.parse_example`` per batch), decoded with ``tf.io.decode_raw`` (or
``tf.io.decode_png``/``decode_jpeg`` for format version 2 images),
reshaped and prefetched. Other formats go through the core reader's batched reads, run by tf.data's
parallel map (``tf.numpy_function``, several batches at once, kept in order) into recycled memory, each pass
over the dataset being a new epoch; ``normalize=True`` then normalises as it reads (one pass for uint8).

``augment=`` runs a :mod:`shardkit.augment` pipeline on each batch in TensorFlow ops
(:mod:`shardkit.augment.tf`), after parsing and before normalising. Each batch carries its samples'
global indices and the epoch it was drawn for: pass ``k`` over the dataset (each new iterator: a
Keras epoch, one ``repeat()`` round) draws epoch ``epoch + k``, so a sample's draws depend on
(seed, epoch, index) only, never on the batch it lands in.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from ..codecs import encoding
from ..codecs.onehot import channel_lut
from ..codecs.registry import JPEG_EOI, JPEG_FRAME_MAGIC, JPEG_GROUPS, jpeg_frame_header_size
from ..errors import ConfigError, ShardFormatError
from ..formats.base import TfRecordLayout
from . import sampling
from .dataset import Dataset, adapter_dataset
from .options import EpochPlan, OpenOptions, adapter_options, adapter_plan, refuse_unknown
from .recycle import POOL, normalized
from .sampling import EpochBatchSampler, parse_sampling
from .state import LoaderState, Progress

if TYPE_CHECKING:
    from ..augment import Compose

AUTOTUNE = tf.data.AUTOTUNE
_TF_TYPES = {"bytes": tf.string, "int64": tf.int64}
#: libjpeg's accurate integer IDCT, the one OpenCV decodes with: TensorFlow's default (the fast IDCT) put pixels
#: up to 14 levels from the numpy path's on CamVid at quality 95; with this they are equal.
JPEG_DCT = "INTEGER_ACCURATE"


def _tf_seed(seed: int, epoch: int) -> int:
    """A 31-bit TensorFlow op seed derived from (seed, epoch)."""
    return int(np.random.SeedSequence([int(seed), int(epoch), 2]).generate_state(1)[0] >> 1)


def dataset(
    path: str | os.PathLike[str] | Dataset,
    plan: EpochPlan | int | None = None,
    *,
    options: OpenOptions | None = None,
    normalize: bool = False,
    cycle_length: int = 4,
    with_keys: bool = False,
    augment: Compose | str | None = None,
    **deprecated: Any,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of the batches of a converted split: ``(images, labels)``, or
    ``(images, labels, keys)`` with ``with_keys``. Also importable as ``shardkit.tf.dataset`` (TensorFlow is then
    imported on the first call).

    **Unlike the PyTorch and Keras adapters, images are the stored uint8 values, not normalised**, unless
    ``normalize=True``. Every rank gets the same number of samples (padded by wrapping around, or the tail
    dropped with the plan's ``drop_last``). A local TFRecord split is read by tf.data itself (shard-then-buffer
    shuffle) unless the plan's ``shuffle_mode`` is ``"global"`` or its sampling is not uniform; other formats,
    and splits on object storage (through their cache), through the core reader. Pass ``k`` over the returned
    dataset (a Keras epoch, one ``repeat()`` round) reads epoch ``plan.epoch + k``.

    :param path: a split folder (``"out/train"``), a URL (``"s3://bucket/out/train"``) or an open
        :class:`~shardkit.read.dataset.Dataset`.
    :param plan: an :class:`~shardkit.read.options.EpochPlan` (batch size, shuffle, seed, epoch, rank,
        world size, drop_last, shuffle mode, buffer, sampling: ``"uniform"``, ``"class-balanced[:T]"``,
        ``"repeat-factor[:t]"``) or a bare batch size.
    :param options: how ``path`` is opened (:class:`~shardkit.read.options.OpenOptions`: labels, verify,
        cache_dir, cache_limit, storage_options, …). ``labels`` as in :class:`~shardkit.read.dataset.Dataset`:
        ``"ids"`` ``(B, H, W)``, ``"onehot"``, ``"float_onehot"`` ``(B, H, W, C)``, ``"stored"``.
    :param normalize: float32 ``(x - mean) / std`` images with the manifest's channel statistics instead of uint8.
    :param cycle_length: TFRecord files read at once (tf.data ``interleave``).
    :param with_keys: add each sample's key (its image path relative to the input root) as a third element.
    :param augment: a :class:`shardkit.augment.Compose` or its string form (``"scale=0.5:2,crop=352x480,hflip"``),
        applied to each batch in TensorFlow ops with this split's ignore index (255 if none), before normalising;
        needs ``labels="ids"``. Sample ``i`` of pass ``k`` is drawn as ``aug.params(i, seed=seed, epoch=epoch + k,
        …)``, the same as the CPU and GPU paths. Variable-size (non-TFRecord) splits are then read one sample at
        a time and padded to a common canvas (images 0, labels the ignore index).
    :param deprecated: the keywords ``plan`` and ``options`` replaced (``batch_size=``, ``shuffle=``, ``seed=``,
        ``labels=``, …), accepted for this release with a DeprecationWarning.
    :returns: the batched, prefetched ``tf.data.Dataset``: ``images`` ``(B, H, W, 3)`` uint8 (float32 with
        ``normalize``), ``labels`` as ``options.labels`` asks, ``keys`` tf.string. It has
        ``state_dict(batches=None)`` and ``load_state_dict(state)`` (:mod:`shardkit.read.state`, docs/resume.md):
        the state after ``batches`` batches of the current pass (tf.data reads ahead, so pass the steps the
        training loop took), and a resume at a state — the next pass reads the rest of its epoch, in the same
        order, augmented the same.
    :raises ConfigError: an unknown keyword; a split of samples of different sizes without an augment pipeline
        ending in a crop (or, read by tf.data, at all); an augment pipeline that normalises when ``normalize`` is
        set too; a state asked of a TFRecord split tf.data reads itself (use ``shuffle_mode="global"``).
    :raises ShardFormatError: a shard that does not match its manifest.
    """
    the_plan = adapter_plan("dataset", plan, deprecated)
    opts = adapter_options("dataset", options, deprecated)
    refuse_unknown("dataset", deprecated)
    ds = adapter_dataset(path, opts, options)
    aug = _augment_pipeline(augment)
    layout = ds.format_info.tf_records(ds.manifest.format_options, ds.manifest.format_version)
    global_order = parse_sampling(the_plan.sampling)[0] != "uniform" or the_plan.shuffle_mode == "global"
    tf_reads = layout is not None and ds.cache is None and not global_order  # object storage: via the cache
    if aug is None:
        ds.require_fixed_size()
    else:
        ds.check_augment(aug)
        if aug.normalizes and normalize:
            raise ConfigError("the augment pipeline normalises already (Normalize); the dataset would normalise "
                              "twice", fix="pass normalize=False")
        if _one_size(ds) is None and tf_reads:
            raise ConfigError("tf.data reads TFRecord splits of fixed-size samples only, and this split's "
                              "images differ in size", path=ds.path,
                              fix="convert with --size HxW, or to a random-access format (npy, lmdb, hdf5)")
    _open_local_shards(ds)
    if layout is not None and tf_reads:
        out = _tfrecord_pipeline(ds, layout, the_plan, cycle_length=cycle_length, with_keys=with_keys,
                                 with_indices=aug is not None)
        progress = None
    else:
        sampler = ds.sampler(the_plan, augment=aug)  # the plan checked against this split now, not in TF
        progress = sampler.progress.twin()
        out = _generator_pipeline(ds, sampler, progress, with_keys=with_keys, with_indices=aug is not None,
                                  normalize=normalize and aug is None)
    if aug is not None:
        out = _augment_stage(ds, out, aug, seed=the_plan.seed, with_keys=with_keys)
    if normalize and (aug is not None or progress is None):  # else normalised as read
        op = ds.normalizer  # A.Normalize(ds.mean, ds.std): the same float32 constants as the numpy/torch paths
        mean, inv_std = tf.constant(op.mean_f32), tf.constant(op.inv_std_f32)

        def norm(images: tf.Tensor, *rest: tf.Tensor) -> tuple[tf.Tensor, ...]:
            return ((tf.cast(images, tf.float32) - mean) * inv_std, *rest)

        out = out.map(norm, num_parallel_calls=AUTOTUNE, deterministic=True)
    return _with_state(out.prefetch(AUTOTUNE), progress)


def _with_state(out: tf.data.Dataset, progress: Progress | None) -> tf.data.Dataset:
    """``out`` with ``state_dict(batches=None)`` / ``load_state_dict(state)`` (:mod:`shardkit.read.state`)."""

    def state_dict(batches: int | None = None) -> dict[str, Any]:
        if progress is None:
            raise ConfigError(_NO_STATE, fix="pass plan=EpochPlan(…, shuffle_mode='global') to resume a TFRecord split")
        return progress.state_dict(batches)

    def load_state_dict(state: Mapping[str, Any] | LoaderState) -> None:
        if progress is None:
            raise ConfigError(_NO_STATE, fix="pass plan=EpochPlan(…, shuffle_mode='global') to resume a TFRecord split")
        progress.load_state_dict(state)

    out.state_dict, out.load_state_dict = state_dict, load_state_dict
    return out


_NO_STATE = "tf.data reads this TFRecord split itself (shard-then-buffer), which keeps no loader state to resume"


def _open_local_shards(ds: Dataset) -> None:
    """Open (and so check) every local shard now: inside tf.data a damaged shard would surface mid-epoch as a
    TensorFlow error wrapping ours (or TF's own DataLossError), with a traceback. Opening is cheap (a memory
    map and its checks); gzip TFRecord shards, which TF decompresses as a stream, and shards on object storage,
    which would all be downloaded, are left to their first read."""
    if ds.cache is not None:
        return
    for reader in ds.readers:
        if reader.format_options.get("compression") != "gzip" or ds.format != "tfrecord":
            reader.ensure_open()


def _one_size(ds: Dataset) -> tuple[int, int] | None:
    """The (H, W) every sample of the split has, or None when sizes differ."""
    try:
        return ds.require_fixed_size()
    except ConfigError:
        return None


def _augment_pipeline(augment: Compose | str | None) -> Compose | None:
    """``augment=`` as a Compose: its string form parsed, anything else refused."""
    from ..augment import Compose, parse

    if augment is None or isinstance(augment, Compose):
        return augment
    if isinstance(augment, str):
        return parse(augment)
    raise ConfigError(f"augment must be a shardkit.augment.Compose or its string form, got {type(augment).__name__}",
                      fix="e.g. augment='scale=0.5:2,crop=352x480,hflip'")


def _augment_stage(ds: Dataset, out: tf.data.Dataset, aug: Compose, *, seed: int,
                   with_keys: bool) -> tf.data.Dataset:
    """Batches carrying ``index`` and ``epoch`` (and ``hw`` when padded) → augmented (images, labels[, keys])."""
    from ..augment.tf import apply_batch, check_ops, output_hw

    check_ops(aug)  # an op TF cannot apply, or samples of different sizes: ConfigError now, not inside TF
    output_hw(aug, _one_size(ds))
    ignore = 255 if ds.ignore_index is None else int(ds.ignore_index)

    def augment(batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, ...]:
        images, labels = apply_batch(aug, batch["images"], batch["labels"], batch["index"], seed=seed,
                                     epoch=batch["epoch"], ignore_index=ignore, hw=batch.get("hw"))
        return (images, labels, batch["keys"]) if with_keys else (images, labels)

    return out.map(augment, num_parallel_calls=AUTOTUNE, deterministic=True)


def _pass_epochs(first: int) -> tf.data.Dataset:
    """An endless dataset of one epoch number, the next one on each new iterator: pass k → ``first + k``."""
    counter = itertools.count(first)

    def generate() -> Iterator[int]:
        e = next(counter)
        while True:
            yield e

    return tf.data.Dataset.from_generator(generate, output_signature=tf.TensorSpec((), tf.int64))


def _padded(ds: Dataset, idx: np.ndarray, ignore: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Samples of different sizes on one canvas: images padded with 0, labels with ``ignore``; their (h, w)."""
    samples = [ds[int(i)] for i in idx]
    hw = np.array([img.shape[:2] for img, _ in samples], np.int32).reshape(-1, 2)
    h, w = (int(v) for v in hw.max(0)) if len(samples) else (0, 0)
    images = np.zeros((len(samples), h, w, ds.spec.image_channels), ds.spec.stored_image_dtype.newbyteorder("="))
    labels = np.full((len(samples), h, w), ignore, ds.label_dtype)
    for k, (img, lab) in enumerate(samples):
        images[k, :img.shape[0], :img.shape[1]] = img
        labels[k, :lab.shape[0], :lab.shape[1]] = lab
    return images, labels, hw


def _generator_pipeline(ds: Dataset, sampler: EpochBatchSampler, progress: Progress, *, with_keys: bool,
                        with_indices: bool = False, normalize: bool = False) -> tf.data.Dataset:
    """Random-access formats: the core reader's batches of ``sampler``; each new iteration is the next epoch
    (counted by ``progress``). A generator gives each batch's indices; the batches are read in parallel by
    tf.data's threads (``tf.numpy_function``: the reads copy out of memory maps and normalise without the GIL),
    in order, into recycled memory (:mod:`shardkit.read.recycle`); ``normalize``: float32 images normalised there
    in one pass.

    ``with_indices``: elements are dicts with ``images``, ``labels``, ``index`` (global sample indices),
    ``epoch`` (the pass's epoch), ``keys`` with ``with_keys``, and ``hw`` (each sample's size) for a split
    of variable-size samples, which are padded to a common canvas."""
    batch_size, drop_last = sampler.plan.batch_size, sampler.plan.drop_last
    bdim = batch_size if drop_last else None
    variable = _one_size(ds) is None
    if variable:
        ishape, lshape = (None, None, None, ds.spec.image_channels), (None, None, None)
        idt, ldt = ds.spec.stored_image_dtype.newbyteorder("="), ds.label_dtype
    else:
        (ishape, idt), (lshape, ldt) = ds.batch_layout(batch_size if drop_last else 0)  # type: ignore[assignment]
    parts: dict[str, tf.TensorSpec] = {
        "images": tf.TensorSpec((bdim, *ishape[1:]), tf.float32 if normalize else tf.as_dtype(idt)),
        "labels": tf.TensorSpec((bdim, *lshape[1:]), tf.as_dtype(ldt))}
    if with_keys:
        parts["keys"] = tf.TensorSpec((bdim,), tf.string)
    if with_indices:
        parts |= {"index": tf.TensorSpec((bdim,), tf.int64), "epoch": tf.TensorSpec((), tf.int64)}
        if variable:
            parts["hw"] = tf.TensorSpec((bdim, 2), tf.int32)
    keys = np.array([ds.key(i) for i in range(len(ds))], dtype=object) if with_keys else None
    ignore = 255 if ds.ignore_index is None else int(ds.ignore_index)
    names = list(parts)
    read_names = [n for n in names if n not in ("index", "epoch")]
    op = ds.normalizer if normalize else None

    def order() -> Iterator[tuple[np.ndarray, np.int64]]:
        progress.begin()  # this pass: the sampler's epoch, from its start (or where a loader state resumes it)
        e = sampler.epoch
        batches = sampler.batches()
        sampler.start, sampler.epoch = 0, e + 1  # the next pass: the next epoch, from its start
        for idx in batches:
            progress.step()
            yield np.asarray(idx, np.int64), np.int64(e)

    def read(idx: np.ndarray) -> list[np.ndarray]:
        hw = None
        if variable:  # read one by one onto a padded canvas (only with augment: check_augment allowed it)
            images, labels, hw = _padded(ds, idx, ignore)
        else:  # recycled arrays: freed (and reused) only when TensorFlow lets go of the batch
            (bi, bt), (bl, lt) = ds.batch_layout(len(idx))
            images, labels = ds.batch(idx, out=(POOL.take(bi, bt), POOL.take(bl, lt)))
        if op is not None:
            images = normalized(op, images)
        got: dict[str, Any] = {"images": images, "labels": labels, "hw": hw,
               "keys": keys[idx].astype(bytes) if keys is not None else None}
        return [got[n] for n in read_names]

    def parallel(idx: tf.Tensor, epoch: tf.Tensor) -> Any:
        got = tf.numpy_function(read, [idx], [parts[n].dtype for n in read_names], stateful=False)
        element = {"index": idx, "epoch": epoch}
        for name, t in zip(read_names, got, strict=True):
            t.set_shape(parts[name].shape)
            element[name] = t
        return element if with_indices else tuple(element[n] for n in names)

    indices = tf.data.Dataset.from_generator(order, output_signature=(tf.TensorSpec((None,), tf.int64),
                                                                       tf.TensorSpec((), tf.int64)))
    return indices.map(parallel, num_parallel_calls=AUTOTUNE, deterministic=True)


def _feature_spec(ds: Dataset, layout: TfRecordLayout, with_keys: bool) -> dict[str, Any]:
    """``tf.io.parse_example`` spec of the features we read, from the manifest's ``format_options``."""
    spec = {}
    keys = (layout.image_key, layout.label_key)
    for key in (*keys, "key") if with_keys else keys:
        kind = layout.features.get(key)
        if kind not in _TF_TYPES:
            raise ShardFormatError(f"TFRecord feature {key!r} is {kind!r} in the manifest, expected bytes",
                                   path=ds.path / "manifest.json", fix="re-convert this split")
        spec[key] = tf.io.FixedLenFeature([], _TF_TYPES[kind])
    return spec


def _tfrecord_pipeline(ds: Dataset, layout: TfRecordLayout, plan: EpochPlan, *, cycle_length: int,
                       with_keys: bool, with_indices: bool = False) -> tf.data.Dataset:
    """TFRecord read by TensorFlow. ``with_indices``: dict elements as :func:`_generator_pipeline` gives,
    each record's global index counted from its shard's first index, the epoch from :func:`_pass_epochs`."""
    batch_size, shuffle, seed, epoch = plan.batch_size, plan.shuffle, plan.seed, plan.epoch
    drop_last, buffer_size = plan.drop_last, plan.buffer_size
    files = [str(ds.path / shard.files[0].name) for shard in ds.manifest.shards]
    ranges = sampling.stream_ranges(ds.shard_sizes, plan)
    compression = layout.compression_type
    sources = tf.data.Dataset.from_tensor_slices((
        tf.constant([files[s] for s, _, _ in ranges], tf.string),
        tf.constant([a for _, a, _ in ranges], tf.int64),
        tf.constant([n for _, _, n in ranges], tf.int64),
        tf.constant([ds.manifest.shards[s].first_index + a for s, a, _ in ranges], tf.int64)))

    def records(file: tf.Tensor, skip: tf.Tensor, take: tf.Tensor, first: tf.Tensor) -> tf.data.Dataset:
        out = tf.data.TFRecordDataset(file, compression_type=compression).skip(skip).take(take)
        return tf.data.Dataset.zip((out, tf.data.Dataset.range(first, first + take))) if with_indices else out

    # Without shuffling, keep the stream order (one file at a time).
    cycle = max(1, min(cycle_length, len(ranges))) if shuffle else 1
    out = sources.interleave(records, cycle_length=cycle, block_length=1, num_parallel_calls=AUTOTUNE,
                             deterministic=True)
    if shuffle:
        out = out.shuffle(buffer_size, seed=_tf_seed(seed, epoch), reshuffle_each_iteration=True)
    out = out.batch(batch_size, drop_remainder=drop_last)

    hw = ds.require_fixed_size()  # also a split converted without --size whose records share one size
    feature_spec = _feature_spec(ds, layout, with_keys)
    channels, image_dtype = ds.spec.image_channels, ds.spec.stored_image_dtype.newbyteorder("=")
    decode_images = _image_decoder(layout.image_codec, hw, channels, image_dtype)
    stored_dtype = ds.spec.stored_label_dtype
    stored_shape = ds.spec.label_shape(hw)
    to_labels = _label_converter(ds)
    b = batch_size if drop_last else -1  # keeps the batch dimension static when it is

    def parse(serialized: tf.Tensor) -> tuple[tf.Tensor, ...]:
        ex = tf.io.parse_example(serialized, feature_spec)
        images = tf.reshape(decode_images(ex[layout.image_key]), (b, *hw, channels))
        stored = tf.reshape(tf.io.decode_raw(ex[layout.label_key], tf.as_dtype(stored_dtype.newbyteorder("=")),
                                             little_endian=True), (b, *stored_shape))
        result = (images, to_labels(stored))
        return (*result, ex["key"]) if with_keys else result

    if not with_indices:
        return out.map(parse, num_parallel_calls=AUTOTUNE, deterministic=True)

    def parse_indexed(batch: tuple[tf.Tensor, tf.Tensor], epoch: tf.Tensor) -> dict[str, tf.Tensor]:
        images, labels, *keys = parse(batch[0])
        return {"images": images, "labels": labels, "index": batch[1], "epoch": epoch,
                **({"keys": keys[0]} if keys else {})}

    return tf.data.Dataset.zip((out, _pass_epochs(epoch))).map(parse_indexed, num_parallel_calls=AUTOTUNE,
                                                                deterministic=True)


def _image_decoder(codec: str, hw: tuple[int, int], channels: int = 3, dtype: Any = np.uint8) -> Any:
    """A batch of image features → (B, H, W, C) in the stored type: decode_raw (little-endian), or in-graph
    decode_png (8- or 16-bit) / decode_jpeg."""
    tf_dtype = tf.as_dtype(np.dtype(dtype))
    if codec == "raw":
        return lambda data: tf.io.decode_raw(data, tf_dtype, little_endian=True)
    if codec not in ("png", "jpeg"):
        raise ConfigError(f"TensorFlow cannot decode {codec!r} images in-graph")

    def one(data: tf.Tensor) -> tf.Tensor:
        if codec == "png":
            decoded = tf.io.decode_png(data, channels=channels, dtype=tf_dtype)
        elif len(JPEG_GROUPS.get(channels, ())) > 1:
            decoded = _decode_jpeg_frame(data, hw, channels)
        else:
            decoded = _decode_jpeg(data, hw, channels, "jpeg image")
        return tf.ensure_shape(decoded, (*hw, channels))  # a wrong size fails, never reshapes

    return lambda data: tf.map_fn(one, data, fn_output_signature=tf.TensorSpec((*hw, channels), tf_dtype))


def _decode_jpeg_frame(data: tf.Tensor, hw: tuple[int, int], channels: int) -> tf.Tensor:
    """One jpeg band frame of 2 or 4 bands (``formats/codecs.md``) → (H, W, C) uint8, in-graph: the magic, stream
    count, lengths and each stream's header (``extract_jpeg_shape``) are checked before any stream is decoded, as
    :func:`shardkit.codecs.registry.jpeg_frame_streams` checks them; each stream then goes to ``decode_jpeg``."""
    groups = JPEG_GROUPS[channels]
    head = jpeg_frame_header_size(channels)
    size = tf.cast(tf.strings.length(data), tf.int64)
    whole = tf.debugging.Assert(size >= head, ["jpeg band frame shorter than its header", size])
    with tf.control_dependencies([whole]):
        fields = tf.io.decode_raw(tf.strings.substr(data, 0, head), tf.int32, little_endian=True)
    lengths = tf.cast(fields[2:], tf.int64)  # a length of 2**31 or more reads negative: refused as < 1
    checks = [tf.debugging.Assert(tf.strings.substr(data, 0, 4) == JPEG_FRAME_MAGIC,
                                  [f"jpeg data of {channels} bands is not a band frame (its first 4 bytes are "
                                   f"not {JPEG_FRAME_MAGIC.decode()})"]),  # no data bytes: the message is text
              tf.debugging.Assert(tf.equal(fields[1], len(groups)),
                                  [f"jpeg band frame: {channels} bands need {len(groups)} streams, it has", fields[1]]),
              tf.debugging.Assert(tf.logical_and(tf.reduce_all(lengths >= 1), head + tf.reduce_sum(lengths) == size),
                                  ["jpeg band frame's stream lengths do not fill it exactly", lengths, size])]
    starts = head + tf.cumsum(lengths, exclusive=True)
    bands = []
    for k, comps in enumerate(groups):
        with tf.control_dependencies(checks):
            stream = tf.strings.substr(data, starts[k], lengths[k])
        bands.append(_decode_jpeg(stream, hw, comps, f"jpeg band frame stream {k + 1}"))
    return tf.concat(bands, axis=-1)


def _decode_jpeg(data: tf.Tensor, hw: tuple[int, int], comps: int, what: str) -> tf.Tensor:
    """One JPEG file → (H, W, comps) uint8, its header (``extract_jpeg_shape``) and end-of-image marker checked
    first as the numpy path checks them: ``decode_jpeg(channels=3)`` would otherwise turn a gray file into three
    equal bands."""
    ends = tf.debugging.Assert(tf.strings.substr(data, -2, 2) == JPEG_EOI,
                               [f"{what}: does not end with the JPEG end-of-image marker (truncated)"])
    with tf.control_dependencies([ends]):  # in this order, always: a truncated stream is named as truncated
        shape = tf.io.extract_jpeg_shape(data, output_type=tf.int32)
    same = tf.debugging.Assert(tf.reduce_all(tf.equal(shape, (*hw, comps))),
                               [f"{what}: header says", shape, f"expected {(*hw, comps)}"])
    with tf.control_dependencies([same]):
        return tf.io.decode_jpeg(data, channels=comps, dct_method=JPEG_DCT)


def _label_converter(ds: Dataset) -> Any:
    """Stored labels (a batch) → the output asked for (``ds.output``), in TensorFlow ops: the TensorFlow
    side of :func:`shardkit.codecs.encoding.transcode_into`."""
    src, dst, c = ds.spec.encoding, ds.output, ds.num_classes
    ignore = ds.ignore_index
    ids_dtype = tf.as_dtype(np.dtype(ds.spec.label_dtype).newbyteorder("="))

    def unpack(packed: tf.Tensor) -> tf.Tensor:
        """(B, H, W, ceil(C/8)) big-bit-order bytes → (B, H, W, C) 0/1 uint8, static shape kept."""
        shifts = tf.constant([7, 6, 5, 4, 3, 2, 1, 0], tf.uint8)
        bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(packed[..., None], shifts), 1)
        b, h, w, nbytes = packed.shape
        return tf.reshape(bits, (-1 if b is None else b, h, w, nbytes * 8))[..., :c]

    def convert(stored: tf.Tensor) -> tf.Tensor:
        if dst is src:
            return stored
        hot = (unpack(stored) if isinstance(src, encoding.Packed)
               else stored if isinstance(src, encoding.OneHot) else None)
        if isinstance(dst, encoding.Index):
            assert hot is not None
            ids = tf.cast(tf.argmax(hot, axis=-1), ids_dtype)
            if ignore is not None:
                ids = tf.where(tf.reduce_max(hot, axis=-1) == 0, tf.cast(ignore, ids_dtype), ids)
            return ids
        dtype = tf.as_dtype(dst.dtype)
        if not isinstance(dst, encoding.OneHot):  # reader_output: ids, one-hot, or the stored encoding itself
            raise ShardFormatError(f"cannot turn {src!r} labels into {dst!r}")
        if hot is None:  # the ignore id (no channel, shardkit.codecs.onehot) and ids ≥ C give all-zero vectors
            ids = tf.cast(stored, tf.int32)
            if dst.dropped_class is not None:
                ids = tf.gather(tf.constant(channel_lut(c, ignore), tf.int32), tf.minimum(ids, c))
            return tf.one_hot(ids, dst.channels, dtype=dtype)
        if dst.dropped_class is not None:  # the ignore class's stored plane is not an output channel
            hot = tf.gather(hot, dst.channel_classes, axis=-1)
        return tf.cast(hot, dtype)

    return convert
