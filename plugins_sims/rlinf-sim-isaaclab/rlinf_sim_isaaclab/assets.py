"""A local Isaac asset root (``ISAACSIM_ASSET_ROOT``) built from what the ``newton`` wheel ships.

Isaac Lab reads its robots and ground planes from NVIDIA's asset server; offline, every task
fails after about 46 s of retries. The ``newton`` wheel (an Isaac Lab dependency) carries
flattened copies of some of those robots under ``newton/examples/assets``; placed where Isaac Lab
looks for them under a local root, plus a small ground plane written here, they make the
classic tasks run offline:

- Isaac-Cartpole-Direct-v0, Isaac-Cartpole-v0: ``cartpole_single_pendulum.usda`` (its
  ``defaultPrim`` is renamed from ``cartPole`` to ``cartpole``, the name Isaac Lab's cartpole
  config expects);
- Isaac-Ant-Direct-v0, Isaac-Ant-v0: ``ant.usda``.

``python -m rlinf_sim_isaaclab.assets DEST`` builds it (``make isaaclab`` does, into
``.venv-isaaclab/isaac-assets``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# where Isaac Lab's configs look (relative to the asset root) <- file in newton/examples/assets
CARTPOLE = "Isaac/IsaacLab/Robots/Classic/Cartpole/cartpole.usd"
ANT = "Isaac/Robots/IsaacSim/Ant/ant_instanceable.usd"
GROUND_PLANE = "Isaac/IsaacLab/Environments/Grid/default_ground_plane_checker_v1/default_ground_plane.usda"

# A collision plane is all the physics needs of Isaac Lab's ground (its own file adds a grid
# material and visuals). Isaac Lab spawns the file under /World/ground and applies its physics
# material to the prims it finds.
GROUND_PLANE_USDA = """#usda 1.0
(
    defaultPrim = "GroundPlane"
    metersPerUnit = 1
    upAxis = "Z"
)

def Xform "GroundPlane"
{
    def Plane "CollisionPlane" (
        prepend apiSchemas = ["PhysicsCollisionAPI"]
    )
    {
        uniform token axis = "Z"
        double length = 200
        double width = 200
    }
}
"""


def newton_assets() -> Path:
    spec = importlib.util.find_spec("newton")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the 'newton' package is not installed (it comes with isaaclab==3.0.0)")
    path = Path(list(spec.submodule_search_locations)[0]) / "examples" / "assets"
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is missing: this newton wheel ships no example assets")
    return path


def build(dest: str | Path) -> list[Path]:
    """Write the asset root into ``dest``; returns the files written."""
    src, root = newton_assets(), Path(dest)
    cartpole = (src / "cartpole_single_pendulum.usda").read_text()
    if 'defaultPrim = "cartPole"' not in cartpole:
        raise ValueError(f"{src / 'cartpole_single_pendulum.usda'}: no defaultPrim \"cartPole\" to rename "
                         "(another newton version?)")
    files = {CARTPOLE: cartpole.replace('defaultPrim = "cartPole"', 'defaultPrim = "cartpole"', 1),
             ANT: (src / "ant.usda").read_text(),
             GROUND_PLANE: GROUND_PLANE_USDA}
    written = []
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m rlinf_sim_isaaclab.assets DEST")
    for p in build(sys.argv[1]):
        print(p)
