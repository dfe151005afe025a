"""Measures a packed dataset's loader as configured and says whether it can feed the model.

``run_bench(path, BenchOptions(...))`` builds the loader a training job would use (PyTorch's
``DataLoader`` over ``packer.torch``'s readers and samplers when torch is installed, else a
plain in-process loop; ``loader="threaded"``: ``packer.threaded.ThreadedLoader``'s threads), discards ``warmup`` batches (worker start-up, first touches of the
index and shards), then times ``batches`` batches. It reports samples/s, payload MB/s, and the
CPU each process used while timing: each DataLoader worker's (the children of this process,
read from ``/proc/<pid>/task/*/schedstat``, nanosecond on-CPU times; no psutil), and the main
process's.

With a ``target_rate`` (the samples/s the model consumes) the pipeline should deliver at least
``HEADROOM`` (1.5) times that: step times vary, workers share cores with the training process,
and a loader running at exactly the model's rate makes the GPU wait at every hiccup. When it
does not, ``advise`` says what to change. It first reads the measurement (``diagnose``), from
the workers that worked (an idle worker says nothing about the others):

* ``oversubscribed``: the run's processes want more CPU than there are cores, and the workers
  wait for a CPU much of the time: use at most N workers.
* ``contended``: the workers wait for a CPU although this run fits the cores: other processes
  use them.
* ``cpu-bound``: the workers compute all the time: more workers while cores are idle, then
  cheaper work, which depends on what is stored (``--codec tiled`` and nvJPEG for JPEGs, another
  codec for PNGs, crops on the GPU for raw pixels, nothing about decoding raw pixels).
* ``main-bound``: the main process collates or pins all the time.
* ``read-bound``: the workers neither compute nor wait for a CPU, and the bytes came from
  storage (``/proc/<pid>/io``'s ``read_bytes``): they wait for reads.
* ``handoff-bound``: nobody is busy although the bytes came from the page cache: batches wait in
  the hand-off between processes (queues, pickling), which small samples feel most.

Whatever the verdict, idle workers are counted and named (a DataLoader deals each epoch's batches
to its workers from worker 0, so an epoch with fewer batches than workers leaves the rest idle:
the note says so and what to change), a dataset smaller than a batch is flagged (every "batch" was the whole
dataset), and the output size defaults to the stored size for raw datasets and images smaller
than 224 pixels (timing an upsampling is not timing the loader).

The modules: ``options`` (``BenchOptions``, ``BenchResult``), ``procstat`` (the ``/proc``
accounting), ``run`` (the loaders and ``run_bench``) and ``diagnosis`` (``diagnose``, ``advise``,
the report).
"""

from .diagnosis import advise, diagnose, format_report, raw_codec_note
from .options import (DECODE_MODES, DEFAULT_SIZE, DIAGNOSES, HEADROOM, LOADERS, READERS, SMALL_IMAGE_SIDE,
                      BenchOptions, BenchResult)
from .procstat import child_pids, process_cpu_seconds, run_queue_seconds, storage_read_bytes
from .run import default_size, run_bench

__all__ = [
    "BenchOptions",
    "BenchResult",
    "DECODE_MODES",
    "READERS",
    "LOADERS",
    "HEADROOM",
    "run_bench",
    "advise",
    "diagnose",
    "DIAGNOSES",
    "DEFAULT_SIZE",
    "default_size",
    "SMALL_IMAGE_SIDE",
    "raw_codec_note",
    "format_report",
    "process_cpu_seconds",
    "run_queue_seconds",
    "storage_read_bytes",
    "child_pids",
]
