"""The audit's probe: what an image holds, read inside it with the image's own python3
(standard library, plus pyelftools and uv bind-mounted from the host under argv[1]).

    python3 -m harness.audit_probe MOUNT MARKER FATBIN_MAGIC_HEX

Prints one line, MARKER followed by JSON: python, site dirs, distributions, every shared
object with its fat-binary sections and NEEDED entries, torch's build facts, `pip check`.
stages/audit.py runs it in a throw-away container (no network) and judges the result.

In an image whose programs run emulated here (an arm64 image on an amd64 host, qemu-user),
the build host's own Python runs it instead, mounted into the container
($INFERMATRIX_PROBE_PYTHON names the image's interpreter): the image's python3 is asked only
for its own facts (version, site dirs, machine), `import torch` and `pip check`; the scan of
every shared object and the hashing run natively, on the same files at the same paths.
"""
import hashlib, importlib.machinery, importlib.metadata as md, importlib.util, json, mmap, os  # noqa: E401
import platform, re, shutil, site, subprocess, sys, sysconfig  # noqa: E401
MOUNT = sys.argv[1]
sys.path.insert(0, MOUNT + "/py")
from elftools.elf.elffile import ELFFile  # noqa: E402 - pyelftools from the mount, on sys.path now
from elftools.elf.dynamic import DynamicSection  # noqa: E402

SO = re.compile(r"\.so(\.\d+)*$")
FATBIN_SECTIONS = {".nv_fatbin", "__nv_relfatbin"}
FATBIN_MAGIC = bytes.fromhex(sys.argv[3])  # a fat binary container kept in a data section

def has_embedded_fatbin(handle):
    with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(FATBIN_MAGIC) != -1

IMAGE_FACTS = ("import json, platform, site, sys, sysconfig\n"
               "dirs = set(site.getsitepackages()) | {sysconfig.get_paths()[k] for k in "
               "('purelib', 'platlib')}\n"
               "print(json.dumps({'dirs': sorted(dirs), 'python': sys.version.split()[0], "
               "'executable': sys.executable, 'machine': platform.machine()}))")

def image_python():
    """(interpreter, its facts): this Python's own, or those of the image's interpreter
    ($INFERMATRIX_PROBE_PYTHON) when the build host's Python runs the probe."""
    other = os.environ.get("INFERMATRIX_PROBE_PYTHON")
    if not other:
        found = set(site.getsitepackages()) | {sysconfig.get_paths()[k]
                                               for k in ("purelib", "platlib")}
        return sys.executable, {"dirs": sorted(found), "python": sys.version.split()[0],
                                "executable": sys.executable, "machine": platform.machine()}
    # this interpreter's home is read at its start; the image's interpreter and what runs it
    # (uv pip check) must find their own
    os.environ.pop("PYTHONHOME", None)
    done = subprocess.run([other, "-c", IMAGE_FACTS], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{other} could not tell its facts: {(done.stderr or done.stdout)[-2000:]}")
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    return facts["executable"], facts

PYTHON, FACTS = image_python()

def site_dirs():
    return sorted(d for d in FACTS["dirs"] if os.path.isdir(d))

def distributions():
    """The image interpreter's distributions (its site dirs: not this Python's path)."""
    return md.distributions(path=site_dirs())

def distribution(name):
    for dist in md.distributions(name=name, path=site_dirs()):
        return dist
    raise md.PackageNotFoundError(name)

def find_spec(name):
    """A top-level module as the image's interpreter would find it (never imported here)."""
    return importlib.machinery.PathFinder.find_spec(name, site_dirs())

def owners():
    table = {}
    for dist in distributions():
        for item in dist.files or ():
            if SO.search(item.name):
                table[os.path.realpath(str(item.locate()))] = dist.metadata["Name"]
    return table

def elf_facts(path):
    with open(path, "rb") as handle:
        if handle.read(4) != b"\x7fELF":
            return None
        handle.seek(0)
        elf = ELFFile(handle)
        names = {s.name for s in elf.iter_sections()}
        needed = []
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                needed += [t.needed for t in section.iter_tags()  # type: ignore[attr-defined]
                           if t.entry.d_tag == "DT_NEEDED"]  # .needed: set by pyelftools at run time
        gpu = bool(names & FATBIN_SECTIONS) or has_embedded_fatbin(handle)
        return {"gpu_code": gpu, "needed": needed}

def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

def shared_objects(dirs, owner_of):
    seen, objects = set(), []
    for base in dirs:
        for root, subdirs, files in os.walk(base):
            subdirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                if not SO.search(name) or os.path.islink(path) or not os.path.isfile(path):
                    continue
                real = os.path.realpath(path)
                if real in seen:
                    continue
                seen.add(real)
                try:
                    facts = elf_facts(path)
                except Exception as exc:  # a damaged file is a finding, not a crash
                    facts = {"gpu_code": False, "needed": [], "error": repr(exc)}
                if facts is None:
                    continue
                facts.update(path=path, rel=os.path.relpath(path, base),
                             size=os.path.getsize(path), dist=owner_of.get(real))
                if facts["gpu_code"]:
                    facts["sha256"] = sha256(path)
                objects.append(facts)
    return objects

def torch_facts():
    code = ("import json, torch; print(json.dumps({'version': torch.__version__, "
            "'cuda': torch.version.cuda, 'arch_list': torch.cuda.get_arch_list()}))")
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout)[-2000:], "static": torch_version_file()}
    return json.loads(done.stdout.strip().splitlines()[-1])

def torch_version_file():
    """torch/version.py read as text (where torch.version.cuda comes from), for when the import
    cannot run here (an arm64 image under qemu-user: oneDNN's xbyak_aarch64 reads MIDR_EL1 from
    sysfs, which qemu-user does not provide)."""
    spec = find_spec("torch")
    path = os.path.join(os.path.dirname(spec.origin or ""), "version.py") if spec else ""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError:
        return None
    found = dict(re.findall(r"^(__version__|cuda)\b[^=]*=\s*'([^']*)'", text, re.M))
    return {"version": found.get("__version__"), "cuda": found.get("cuda"), "file": path}

def wheel_tags(name):
    """The `Tag:` lines of an installed distribution's WHEEL file."""
    try:
        text = distribution(name).read_text("WHEEL") or ""
    except md.PackageNotFoundError:
        return []
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]

def pip_check():
    if find_spec("pip") is not None:
        argv, tool = [PYTHON, "-m", "pip", "check"], "pip"
    elif shutil.which("uv"):
        argv, tool = ["uv", "pip", "check", "--python", PYTHON], "uv (image)"
    else:  # the host's uv, through the host's loader when the host's Python runs this
        loader = json.loads(os.environ.get("INFERMATRIX_NATIVE_LOADER") or "[]")
        argv, tool = [*loader, MOUNT + "/uv", "pip", "check", "--python", PYTHON], "uv (host)"
    env = dict(os.environ, UV_NO_CACHE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
    except OSError as exc:  # e.g. a host uv whose loader this image lacks
        return {"tool": tool, "command": " ".join(argv), "returncode": None,
                "output": f"cannot run it here: {exc}", "machine": FACTS["machine"],
                "wheel_tags": {}}
    output = done.stdout + done.stderr
    # "The package `x` was built for a different platform": the tags its WHEEL file declares
    other_platform = re.findall(r"The package `([^`]+)` was built for a different platform", output)
    return {"tool": tool, "command": " ".join(argv), "returncode": done.returncode,
            "output": output[-4000:], "machine": FACTS["machine"],
            "wheel_tags": {name: wheel_tags(name) for name in other_platform}}

def py_digests(names):
    """Per distribution: sha256 over "path sha256" lines of its .py files (hashed here, not
    taken from RECORD), the count and the version; the native twin check compares them."""
    found = {}
    for name in names:
        try:
            dist = distribution(name)
        except md.PackageNotFoundError:
            continue
        lines = []
        for item in dist.files or ():
            if item.name.endswith(".py"):
                path = str(item.locate())
                if os.path.isfile(path):
                    lines.append(f"{item} {sha256(path)}")
        lines.sort()
        found[re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()] = {  # PEP 503 name
            "version": dist.version, "files": len(lines),
            "sha256": hashlib.sha256("\n".join(lines).encode()).hexdigest()}
    return found

dirs = site_dirs()
has_torch = find_spec("torch") is not None
result = {
    "python": FACTS["python"], "executable": PYTHON, "site_dirs": dirs,
    "distributions": {d.metadata["Name"]: d.version for d in distributions()},
    "objects": shared_objects(dirs, owners()),
    "torch": torch_facts() if has_torch else None,
    "pip_check": pip_check(),
    "py_digests": py_digests([n for n in os.environ.get("INFERMATRIX_DIGEST_DISTS", "").split(",")
                              if n]),
}
print(sys.argv[2] + json.dumps(result))
