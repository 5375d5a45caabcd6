"""Audit a built image without a GPU: kernel coverage per target arch, one CUDA major, the pins.

How it works:
1. A probe (harness/audit_probe.py, standard-library Python) runs once in a throw-away container of the
   image. It lists every ELF shared object under site-packages with its size, sha256, owning
   distribution, ELF NEEDED entries and whether it carries a CUDA fat binary (pyelftools from
   the host is bind-mounted read-only for that: nothing is installed in the image). It also
   reports the installed distributions, `torch.version.cuda`, and `pip check` (the image's pip,
   else its uv, else the host's uv binary mounted read-only).
2. The objects with GPU code whose content hash is not in the cache (<state>/cache/cuobjdump/)
   are copied out of the image (engine.copy_from_image: a created, never started container)
   and listed on the host with `cuobjdump --list-elf` / `--list-ptx` (the `nvidia-cuda-cuobjdump`
   wheel; no CUDA toolkit is needed in the image nor on the host), plus the fat binaries a
   library keeps in its own data sections (cuFFT), read from their headers (coverage.py).
3. coverage.py decides each object per target arch; the other checks compare the probe's facts
   with the cell: one CUDA major, torch's CUDA, installed versions against the lock and the
   cell's pins, `pip check`, the engine against the model card's floor.

Any failing check fails the audit (exit 1); the cell is then not eligible for a tag. Which
objects must cover the arch comes from the loaded set (loadedset.py, data/loaded.yaml, plus the
matrix's `audit.not_loaded`): an object the engine never loads for the cell's model on the arch
is listed as "not loaded" with its entry's reason and source; every other one must be covered
(PTX-JIT ones are flagged). Builds for another CUDA major that a package picks at run time are
no evidence of a mixed image. Two more checks: `triton-smem` compiles the engine's own Triton
attention kernels for the arch in a container of the image (harness/triton_smem.py, no GPU) and
compares their shared memory with the arch's limit; `loaded-set` judges what the live server
mapped, once the `model` smoke level recorded it (server_mapped_objects).
"""

from __future__ import annotations

# The package's parts, each a concept; what is used outside the package is here too (`audit.X`).
from .cache import (  # noqa: F401
    CUOBJDUMP_ENV,
    FAIL,
    HARNESS_DIR,
    PASS,
    PROBE_TIMEOUT_S,
    SKIP,
    DeviceCodeCache,
    embedded_fatbins,
    find_cuobjdump,
    list_device_code,
    relocatable_fatbin_ranges,
)
from .checks import (  # noqa: F401  (the checks named outside the package)
    audited_objects,
    check_cuda_major,
    check_kernels,
    check_loaded_set,
    check_pins,
    check_pip,
    check_torch_cuda,
    cuda_majors,
    expected_pins,
    loaded_set_context,
    runtime_chosen_builds,
    version_matches,
)
from .observe import (  # noqa: F401
    MAPS_PROBE,
    judge_server_maps,
    server_mapped_objects,
)
from .probe import (  # noqa: F401
    MARKER,
    PROBE_PROGRAM,
    ImageFacts,
    NativePython,
    _run_probe,
    copy_rounds,
    native_python,
    parse_probe_output,
    probe_args,
    probe_image,
)
from .result import (  # noqa: F401
    AuditedObject,
    AuditResult,
    Check,
    object_groups,
    parse_targets,
)
from .stage import (  # noqa: F401
    audit_cell,
    images_to_audit,
    step,
)
from .triton import (  # noqa: F401
    check_triton_smem,
    judge_triton,
    not_started,
    serve_paths,
    shared_memory_limits,
    triton_smem_args,
)
from .view import (  # noqa: F401
    render,
)
