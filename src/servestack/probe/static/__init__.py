"""The static probe: what is installed in an image, checked against the lock it was built from.

Standalone and stdlib-only: `servestack.smoke` bind-mounts this directory read-only into the image
and runs it with the image's own interpreter (`/opt/venv/bin/python static CONFIG.json`, see
__main__), so nothing of servestack needs to be installed there: its modules import each other
relatively and nothing else of servestack. It also runs on any host Python against a directory of
installed wheels (`site_packages` in the config), which is how the tests drive it.

The flow (run.py): the file checks against the lock (installed.py: stack.json, versions, overlays,
excluded dependencies, the smoke model), each pull request's evidence and each local patch
(evidence.py), the stack's fast path (fast_path.py), then the isolated sections in child
interpreters: imports and entry points (imports.py), vLLM's parser and environment registry
(engine.py), vLLM's GDN prefill resolver (fast_path.py), and, for a CUDA torch, the build each
installed Triton does at its first GPU kernel launch (runtime_build.py: its whole driver.c through
its own build helper, libcuda left out). A GPU stack adds three more: every undefined symbol of
the serving libraries against the libraries the image carries (elfclosure.py), every module-level
import of the serving entry points (import_closure.py), and, in a child, each GDN prefill and
attention kernel vLLM would pick on SM90 and SM100 against the models' shapes (kernel_shapes.py).
Its gpu_node section (gpu_node.py) reads the image as a GPU node's runtime will, and does on the CPU
what FlashInfer does at engine start: a module compiled *and linked* by FlashInfer's own JIT, the
driver stub it links against kept off the loader's path (flashinfer_jit.py), and each prebuilt
module found where FlashInfer looks, with a cubin per target GPU (read from its .nv_fatbin,
fatbin.py), loading with JIT compilation off (prebuilt.py).
What they share is in report.py.

stdout carries exactly one JSON document: {"probe": "static", "python", "machine", "checks": [...]}
where each check is {"name", "status": "pass"|"fail"|"not_run", "detail"}. Everything else the
probed code prints (vLLM logs to stdout) goes to stderr.

The config (JSON, written by servestack.smoke):
    stack, platform                 for the report
    expected_lock_sha256            sha256 of pins/<stack>.lock on the host
    stack_json                      path of stack.json in the image (/opt/servestack/stack.json)
    site_packages                   null: the interpreter's purelib; or a directory
    wheels                          [{"name", "version"}] the lock's wheels for this platform
    pull_requests                   the lock's pull_requests (evidence re-checked against installed files)
    local_patches                   the lock's local_patches
    fast_path                       null, or the lock's fast_path (torch CUDA, packages, GDN prefill backend)
    excluded                        the lock's excluded [{"name", "reason"}]
    modules                         module names that must import
    entry_points                    modules whose `python -m MODULE --help` must print a usage
    engine                          null, or {"name": "vllm", "flags": {flag: {"value", "sources"}},
                                              "env": {NAME: {"value", "sources"}}}
    model_dir                       null, or the smoke model directory that must exist
    section_timeout                 seconds for each isolated section (imports, engine)
    native_closure                  null, or {"libraries": {package: [globs under site-packages]}}
    import_closure                  null, or the entry modules whose module-level imports must resolve
    kernel_shapes                   null, or {"models": [{"name", "source", "config"}]} (plus model_dir's config.json)
    gpu_node                        null, or the lock's gpu_node (cuda_arch, kernels, prebuilt: {"modules", "archs"}, ...)
    platform                        this image's platform: which of gpu_node.prebuilt.archs its modules must carry

Imports and the engine's argument parser run in child processes (a crash or a hang there is a
failed check, not a lost report).
"""
