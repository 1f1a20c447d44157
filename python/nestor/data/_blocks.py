"""What a data set is made of once planned (its blocks, how to read and map
them): shared by the driver's planning and the ranks' reading."""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional


def _pa():
    try:
        import pyarrow
    except ImportError as e:
        raise ImportError(f'nestor.data needs pyarrow: pip install "nestor[data]" (or pip install pyarrow): {e}') from e
    return pyarrow


@dataclass
class _Block:
    """A unit of reading: a Parquet row group, or a whole CSV/JSON file."""

    path: str
    format: str
    rows: int
    row_group: Optional[int] = None
    #: A part of it only (``train_test_split``, ``limit``): its rows
    #: ``offset:end``, or those at the positions ``take`` (sorted).
    offset: int = 0
    end: Optional[int] = None
    take: Optional[Any] = None
    #: How to read it (``read_images``' size and mode, ``include_paths``), for the formats that have options.
    options: Optional[Dict[str, Any]] = None


@dataclass
class _Plan:
    """What the ranks need: the blocks, in order, and how to read them."""

    name: str
    blocks: List[_Block]
    transforms: List[Any]
    shuffle: bool
    seed: int
    split: bool = True

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.blocks)


def _plans_from_json(text: str, where: str) -> Dict[str, _Plan]:
    """The plans of an experiment file's ``[datasets]`` (``datasets.json``,
    written by the driver), by name."""
    import json

    doc = json.loads(text)
    if doc.get("version") != 1:
        raise RuntimeError(f"{where} was written by another nestor version (plan version {doc.get('version')}, expected 1)")
    plans = {}
    for name, p in doc["datasets"].items():
        blocks = [_Block(b["path"], b["format"], int(b["rows"]), b.get("row_group")) for b in p["blocks"]]
        plans[name] = _Plan(name=name, blocks=blocks, transforms=[], shuffle=bool(p["shuffle"]), seed=int(p["seed"]),
                            split=bool(p["split"]))
    return plans


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _filesystem(url: str) -> Any:
    """The Arrow filesystem of an object-store URL and the path in it, with
    the settings checkpoints use: ``AWS_ENDPOINT``/``AWS_ENDPOINT_URL``,
    ``AWS_REGION``, the keys (and ``GOOGLE_*`` / ``AZURE_*`` for gs:// and az://)."""
    import os

    from pyarrow import fs

    scheme, _, rest = url.partition("://")
    if scheme == "s3":
        kwargs = {}
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")
        if endpoint:
            proto, _, host = endpoint.partition("://")
            kwargs["endpoint_override"], kwargs["scheme"] = (host, proto) if host else (endpoint, "https")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        return fs.S3FileSystem(**kwargs), rest
    filesystem, path = fs.FileSystem.from_uri(url)
    return filesystem, path


def _open(path: str) -> Any:
    """A file to read: a local path, or an object-store URL."""
    if not _is_url(path):
        return path
    filesystem, inner = _filesystem(path)
    return filesystem.open_input_file(inner)


def _read_block(block: _Block) -> Any:
    """The block's rows (of a part of it, only those)."""
    table = _read_whole(block)
    if block.take is not None:
        return table.take(block.take)
    if block.end is not None:
        return table.slice(block.offset, block.end - block.offset)
    return table


def _read_whole(block: _Block) -> Any:
    if block.format == "parquet":
        import pyarrow.parquet as pq

        f = pq.ParquetFile(_open(block.path))
        return f.read_row_group(block.row_group) if block.row_group is not None else f.read()
    if block.format == "csv":
        import pyarrow.csv

        return pyarrow.csv.read_csv(_open(block.path))
    if block.format == "json":
        import pyarrow.json

        return pyarrow.json.read_json(_open(block.path))
    return _read_file(block)


def _read_bytes(path: str) -> bytes:
    if _is_url(path):
        with _open(path) as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


def _read_file(block: _Block) -> Any:
    """A block of the formats read a file at a time: text (a row a line),
    NumPy (a row per entry of the array's first axis), binary (a row per
    file) and images (a row per image, decoded by Pillow)."""
    pa = _pa()
    options = block.options or {}
    paths = {"path": [block.path]} if options.get("include_paths") else {}
    if block.format == "text":
        text = _read_bytes(block.path).decode(options.get("encoding") or "utf-8")
        lines = text.splitlines()
        if options.get("drop_empty_lines", True):
            lines = [line for line in lines if line.strip()]
        return pa.table({"text": lines, **({"path": [block.path] * len(lines)} if paths else {})})
    if block.format == "numpy":
        import io

        import numpy as np

        arr = np.load(io.BytesIO(_read_bytes(block.path)), allow_pickle=False)
        return pa.table({"data": _column(arr), **({"path": [block.path] * len(arr)} if paths else {})})
    if block.format == "binary":
        return pa.table({"bytes": [_read_bytes(block.path)], **paths})
    if block.format == "images":
        return pa.table({"image": _column(_image(block.path, options)[None, ...]), **paths})
    raise ValueError(f"{block.path}: nestor cannot read the format {block.format!r}")


def _image(path: str, options: Dict[str, Any]) -> Any:
    import io

    import numpy as np

    try:
        from PIL import Image
    except ImportError:
        raise ImportError("read_images needs Pillow to decode images: pip install pillow") from None
    image = Image.open(io.BytesIO(_read_bytes(path)))
    if options.get("mode"):
        image = image.convert(options["mode"])
    if options.get("size"):
        height, width = options["size"]
        image = image.resize((width, height))
    return np.asarray(image)


def _select(blocks: List[_Block], keep: Any) -> List[_Block]:
    """The blocks cut to the rows ``keep`` names: a ``range`` of the rows
    (in the blocks' order), or a sorted array of their positions."""
    import dataclasses

    import numpy as np

    out: List[_Block] = []
    first = 0
    for b in blocks:
        if isinstance(keep, range):
            lo, hi = max(keep.start - first, 0), min(keep.stop - first, b.rows)
            if lo < hi:
                if b.take is not None:
                    out.append(dataclasses.replace(b, rows=hi - lo, take=b.take[lo:hi]))
                else:
                    out.append(dataclasses.replace(b, rows=hi - lo, offset=b.offset + lo, end=b.offset + hi))
        else:
            pos = keep[(keep >= first) & (keep < first + b.rows)] - first
            if len(pos):
                take = b.take[pos] if b.take is not None else (b.offset + pos).astype(np.int64)
                out.append(dataclasses.replace(b, rows=len(pos), offset=0, end=None, take=take))
        first += b.rows
    return out


def _column(values: Any) -> Any:
    """An Arrow column of ``values``: an array of several dimensions as
    fixed-size lists (a row per entry of its first axis, read back as one
    NumPy array of the same shape), anything else as Arrow converts it."""
    pa = _pa()
    import numpy as np

    if isinstance(values, np.ndarray) and values.ndim > 1:
        column = pa.array(np.ascontiguousarray(values).reshape(-1))
        for size in reversed(values.shape[1:]):
            column = pa.FixedSizeListArray.from_arrays(column, size)
        return column
    return values


def _tensor(col: Any) -> Any:
    """A column of fixed-size lists as one NumPy array (rows x shape), or None."""
    pa = _pa()
    chunk = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    if not pa.types.is_fixed_size_list(chunk.type) or chunk.null_count:
        return None
    shape = []
    while pa.types.is_fixed_size_list(chunk.type):
        shape.append(chunk.type.list_size)
        chunk = chunk.flatten()
    return chunk.to_numpy(zero_copy_only=False).reshape((len(col), *shape))


def _to_format(table: Any, fmt: str) -> Any:
    if fmt == "pyarrow":
        return table
    if fmt == "pandas":
        return table.to_pandas()
    import numpy as np

    out = {}
    for name in table.column_names:
        col = table.column(name)
        tensor = _tensor(col)
        if tensor is not None:
            out[name] = tensor
            continue
        try:
            out[name] = col.to_numpy()
        except Exception:
            out[name] = np.array(col.to_pylist(), dtype=object)
        if out[name].dtype == object and len(out[name]) and isinstance(out[name][0], (list, np.ndarray)):
            out[name] = np.stack([np.asarray(v) for v in out[name]])
    return out


def _from_format(batch: Any) -> Any:
    pa = _pa()
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, dict):
        cols = {}
        for k, v in batch.items():
            if hasattr(v, "detach"):  # a torch tensor
                v = v.detach().cpu().numpy()
            cols[k] = _column(v)
        return pa.table(cols)
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):
        return pa.Table.from_pandas(batch, preserve_index=False)
    raise TypeError(f"map_batches: the function returned {type(batch).__name__}; return a dict of arrays, a DataFrame or a pyarrow Table")


def _apply(table: Any, transforms: List[Any]) -> Any:
    for fn, fmt, kwargs in transforms:
        table = _from_format(fn(_to_format(table, fmt), **kwargs))
    return table
