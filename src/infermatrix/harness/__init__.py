"""The harness: small programs that run inside a built image.

Mounted read-only at /opt/infermatrix/harness/ when a container of the image runs (never baked
into an image), so it may use only the standard library plus what the image itself has: torch,
transformers, tokenizers, the engine. Each program prints one result line,
`INFERMATRIX-RESULT {json}`, as its last line of stdout, so a driver can find it among whatever
the imported packages print. Run them as `python3 -m harness.<name>` with /opt/infermatrix on
PYTHONPATH (or as `infermatrix.harness.<name>` from a checkout).

- audit_probe         what the image holds for the audit: objects and their fat binaries, pins
- static_check        import every installed engine and kernel package, versions against pins
- gpu_check           device capability against the cell's arch; torch and kernel-package kernels
                      run and agree with a torch reference
- make_fixture_model  a tiny random-weight qwen3_5_text model, tokenizer and chat template
- probe               OpenAI-compatible API client: health, thinking on/off, greedy, concurrency
- triton_smem         compiles the engine's Triton attention kernels for a target arch (no GPU)
"""

from ._result import RESULT_MARKER  # noqa: F401
