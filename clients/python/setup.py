"""Generates the gRPC stubs from the proto when the package is built, so they always match the API.

The proto is read from ../../proto (this folder inside the repository), or from INFINI_SIDECAR_PROTO.
The generated service module imports the messages as the top-level package `sidecar.v1`; that import
is rewritten to a relative one so the stubs live inside `infini_sidecar` and claim no global name.
"""
import os
import re
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PROTO_ROOT = Path(os.environ.get("INFINI_SIDECAR_PROTO", HERE.parent.parent / "proto"))
PROTO = PROTO_ROOT / "sidecar" / "v1" / "sidecar.proto"


def generate(package_dir: Path) -> None:
    from grpc_tools import protoc

    if not PROTO.exists():
        raise SystemExit(f"{PROTO}: the API's proto is missing (set INFINI_SIDECAR_PROTO)")
    with tempfile.TemporaryDirectory() as out:
        args = ["protoc", f"-I{PROTO_ROOT}", f"--python_out={out}", f"--pyi_out={out}",
                f"--grpc_python_out={out}", str(PROTO)]
        if protoc.main(args) != 0:
            raise SystemExit(f"grpc_tools.protoc failed on {PROTO}")
        generated = Path(out) / "sidecar" / "v1"
        for name in ["sidecar_pb2.py", "sidecar_pb2.pyi", "sidecar_pb2_grpc.py"]:
            text = (generated / name).read_text()
            text = re.sub(r"^from sidecar\.v1 import sidecar_pb2", "from . import sidecar_pb2", text,
                          flags=re.M)
            (package_dir / name).write_text(text)


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        generate(Path(self.build_lib) / "infini_sidecar")


setup(cmdclass={"build_py": BuildWithStubs})
