"""What ``packer bench`` measures with (``BenchOptions``) and what it reports (``BenchResult``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import OptionError
from ..order import ORDERS

#: What each sample is turned into: ``none`` (stored bytes), ``full`` (``decode_image``: full
#: size, so the batch is a list), ``rrc`` (fused ``RandomResizedCrop`` + flip), ``center``
#: (fused resize + ``CenterCrop``, evaluation).
DECODE_MODES = ("none", "full", "rrc", "center")
#: ``map``: ``PackedDataset`` + ``PackedBatchSampler``; ``iterable``: ``PackedIterableDataset``.
READERS = ("map", "iterable")
#: ``auto``: torch's DataLoader when torch imports, else the in-process loop; ``torch``: require
#: torch; ``threaded``: ``packer.threaded.ThreadedLoader`` (batches on threads of this process,
#: no worker processes; ``workers`` is its thread count); ``simple``: the in-process loop.
LOADERS = ("auto", "torch", "threaded", "simple")
#: Encoded images whose median longer side is at most this are "small": decoding them costs
#: less than the per-sample Python around it, and ``--codec raw`` (decoded pixels, batched
#: crops) is the fast path.
SMALL_IMAGE_SIDE = 96
#: How much faster than the model's consumption the loader should be.
HEADROOM = 1.5
#: The ``rrc``/``center`` output size for images at least this large (else the stored size).
DEFAULT_SIZE = 224
#: What ``diagnose`` can say of a run (see the module docstring).
DIAGNOSES = ("oversubscribed", "contended", "cpu-bound", "main-bound", "read-bound", "handoff-bound")


@dataclass(frozen=True)
class BenchOptions:
    """How to build the loader under test (the CLI's options, one to one).

    Attributes:
        batch_size: samples per batch.
        workers: DataLoader worker processes, or ``ThreadedLoader``'s threads with
            ``loader="threaded"`` (``None``: the cores this process may use).
        order: ``sequential``, ``random`` or ``block`` (see ``packer.order``).
        decode: one of ``DECODE_MODES``.
        size: output size of the ``rrc`` and ``center`` transforms (``None``: ``default_size``,
            the stored size for raw datasets and small images, else ``DEFAULT_SIZE``).
        layout: ``HWC`` (channels-last, what ``normalize_on_gpu`` takes) or ``CHW``.
        backend: the dataset backend (``mmap``, ``pread``, ``direct``).
        reader: one of ``READERS``.
        loader: one of ``LOADERS``.
        batches: batches timed after the warm-up.
        warmup: batches read and discarded first.
        pin_memory: pin batches in the main process (as for GPU training).
        seed: seed of the read order.
        target_rate: samples/s the model consumes; ``None`` for no verdict.
    """

    batch_size: int = 256
    workers: int | None = None
    order: str = "random"
    decode: str = "rrc"
    size: int | None = None
    layout: str = "HWC"
    backend: str = "mmap"
    reader: str = "map"
    loader: str = "auto"
    batches: int = 50
    warmup: int = 5
    pin_memory: bool = False
    seed: int = 0
    target_rate: float | None = None

    def __post_init__(self) -> None:
        checks = [("order", self.order, ORDERS), ("decode", self.decode, DECODE_MODES),
                  ("reader", self.reader, READERS), ("loader", self.loader, LOADERS),
                  ("layout", self.layout, ("HWC", "CHW"))]
        for name, value, allowed in checks:
            if value not in allowed:
                raise OptionError(f"{name} must be one of {list(allowed)}, got {value!r}")
        for name in ("batch_size", "batches", "size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise OptionError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.warmup < 0 or (self.workers is not None and self.workers < 0):
            raise OptionError(f"warmup and workers must not be negative, got warmup={self.warmup}, "
                              f"workers={self.workers}")
        if self.target_rate is not None and not self.target_rate > 0:
            raise OptionError(f"target_rate must be positive, got {self.target_rate}")


@dataclass
class BenchResult:
    """What one run measured; ``to_dict()`` is the ``--json`` document's body."""

    dataset: str
    num_samples: int
    loader: str
    options: dict[str, Any]
    workers: int
    cores: int
    samples: int
    batches: int
    payload_bytes: int
    seconds: float
    samples_per_s: float
    mb_per_s: float
    worker_cpu: list[float] | None
    main_cpu: float
    worker_wait: list[float] | None = None
    main_wait: float | None = None
    target_rate: float | None = None
    required_rate: float | None = None
    meets_target: bool | None = None
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    codec: str = ""  # the dataset's codec name (manifest)
    #: Samples by stored format name (``{"jpeg": 9000, "png": 12}``).
    formats: dict[str, int] = field(default_factory=dict)
    #: The median stored image ``[height, width]`` (None for an empty dataset).
    image_size: list[int] | None = None
    #: The ``rrc``/``center`` output ``[height, width]`` this run used (None for other decodes).
    size: list[int] | None = None
    #: ``diagnose``'s verdict (one of ``DIAGNOSES``).
    diagnosis: str | None = None
    #: Bytes the run's processes read from storage while timed (``/proc/<pid>/io``), or None.
    storage_bytes: int | None = None
    #: ``ThreadedLoader``'s threads (``loader="threaded"``; ``workers`` is then 0), else None.
    threads: int | None = None
    #: Batches in one epoch of the measured reader (the last one may be short).
    batches_per_epoch: int | None = None
    #: Workers that ran or waited for a CPU less than a tenth of the time: they had no batch.
    idle_workers: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
