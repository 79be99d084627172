# Source on the lent GPU machine (bash): NeMo 2.4.1 beside the image's PyTorch, from the carried wheels.
#   . benchmarks/nemo_gpu/device_env.sh .nemo-wheels
# The wheels (benchmarks/NOTES.md, "NeMo on the lent GPU", says which and why) go to /tmp/nemo-site, which
# comes first on PYTHONPATH so that transformers 4.51.3 (NeMo 2.4.1's) shadows the image's 5.x; a .pth file
# in the image's site-packages installs the import stubs of benchmarks/nemo_gpu/import_stubs.py and the
# torch.onnx alias of workshop_lib/nemo_check/onnx_alias.py.
WHEELS=${1:-.nemo-wheels}
if [ ! -e /tmp/nemo-site/.complete ]; then
    rm -rf /tmp/nemo-site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/nemo-site "$WHEELS"/*.whl \
        || { echo "installing the NeMo wheels failed" >&2; return 1; }
    touch /tmp/nemo-site/.complete
fi
mkdir -p /tmp/nemo-stubs
cp "$(dirname "${BASH_SOURCE[0]}")/import_stubs.py" /tmp/nemo-stubs/workshop_import_stubs.py
# modelopt 0.31 (NeMo's pin) imports torch.onnx modules that torch >= 2.9 moved: the alias the CPU check uses.
cp workshop_lib/nemo_check/onnx_alias.py /tmp/nemo-stubs/workshop_onnx_alias.py
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import sys; sys.path.insert(0, '/tmp/nemo-stubs'); import workshop_import_stubs; workshop_import_stubs.install(); import workshop_onnx_alias; workshop_onnx_alias.install()" \
    > "$SITE/workshop_nemo_stubs.pth"
export PYTHONPATH="/tmp/nemo-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/tmp/nemo-site/bin:$PATH"
