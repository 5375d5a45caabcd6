#!/bin/bash
# Run ON THE H200 GPU HOST from a checkout that carries .gpuhost/ (engine/: prepare.sh's tarballs,
# start.sh, py.tar.xz: this project's dependencies for Python 3.12, `uv pip install --target`):
# the gpu level of the sm_90 cell in a real container, through infermatrix's own engine code
# (smoke --image, smoke.gpu_access), and its negative control. Output: docs/h200-gpu-level-container.txt
exec 2>&1
T0=$(date +%s); t() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }
t host; uname -r; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
/opt/torch/.venv/bin/python -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
nvcc --version | tail -2
mkdir -p .gpuhost/py && tar -C .gpuhost -xJf .gpuhost/py.tar.xz
t engine; source .gpuhost/start.sh .gpuhost/engine
SITE=/opt/torch/.venv/lib/python3.12/site-packages
t "cudakern wheels: host nvcc, CUDAKERN_ARCHS=90 and =120 (the negative control)"
for a in 90 120; do
  rm -rf /tmp/ckw$a /tmp/ck$a; mkdir -p /tmp/ckw$a
  ( cd tests/fixtures/cudakern && CUDAKERN_ARCHS=$a MAX_JOBS=8 /opt/torch/.venv/bin/python -m pip wheel -q --no-build-isolation --no-deps -w /tmp/ckw$a . ) 2>&1 | tail -3
  /opt/torch/.venv/bin/python -m pip install -q --no-deps --target /tmp/ck$a /tmp/ckw$a/*.whl 2>&1 | tail -2
  ls /tmp/ckw$a
done
t "rootfs: the host's / without /proc /sys /dev /tmp /home /root /var, the CUDA toolkit and /opt but /opt/torch"
EXCL="--exclude=./proc --exclude=./sys --exclude=./dev --exclude=./tmp --exclude=./run --exclude=./home --exclude=./root --exclude=./var/lib --exclude=./var/cache --exclude=./var/log --exclude=./usr/local/cuda* --exclude=./boot --exclude=./snap --exclude=./mnt --exclude=./media --exclude=./lost+found --exclude=./usr/share/doc --exclude=./usr/src --exclude=./work"
ls /opt
for o in /opt/*; do [ "$o" != /opt/torch ] && EXCL="$EXCL --exclude=.$o"; done
tar -C / --one-file-system -cf /tmp/rootfs.tar $EXCL . 2>&1 | grep -v "socket ignored" | tail -3
ls -la /tmp/rootfs.tar
for a in 90 120; do
  t "image infermatrix-h200-host:cudakern-sm$a (docker import; cudakern for sm_$a in the venv)"
  cp /tmp/rootfs.tar /tmp/rootfs-$a.tar
  (cd /tmp/ck$a && tar -rf /tmp/rootfs-$a.tar --transform "s#^#.$SITE/#" *)
  tar -tf /tmp/rootfs-$a.tar | tail -3
  docker import --change "ENV PATH=/opt/torch/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change 'CMD ["python3"]' /tmp/rootfs-$a.tar infermatrix-h200-host:cudakern-sm$a
  rm -f /tmp/rootfs-$a.tar
done
rm -f /tmp/rootfs.tar; docker images
export PYTHONPATH=$PWD/.gpuhost/py:$PWD/src
CELL=cu130-torch2.13.0-kernel-fixture1.0-sm90
run_smoke() {  # $1 arch of cudakern, $2 pid_host
  sed -i "/^  gpu_access:/d; s/^  model_source: fixture\$/  model_source: fixture\n  gpu_access: {mode: auto, pid_host: $2}/" tests/matrix/matrix.yaml
  t "infermatrix smoke $CELL --image infermatrix-h200-host:cudakern-sm$1 --levels gpu  (smoke.gpu_access: {mode: auto, pid_host: $2})"
  rm -rf /tmp/h200state-$1-$2
  python3 -m infermatrix smoke --matrix tests/matrix/matrix.yaml --state-dir /tmp/h200state-$1-$2 --offline -v $CELL --image infermatrix-h200-host:cudakern-sm$1 --levels gpu 2>&1
  echo "exit code: $?"
  cp /tmp/h200state-$1-$2/journal/$CELL.json $OUT/journal-sm$1-pidhost-$2.json
  find /tmp/h200state-$1-$2 -name 'smoke*.log' -exec cp {} $OUT/smoke-sm$1-pidhost-$2.log \;
}
run_smoke 90 false
run_smoke 90 true
run_smoke 120 true
t done
