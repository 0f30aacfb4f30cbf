"""On PYTHONPATH, makes dlslime_torch._shim fail to import in this
process (test_rpc_codec runs the codec's Python path so)."""
import sys

sys.modules["dlslime_torch._shim"] = None
