"""``shardkit doctor``: is this machine ready to train with shardkit, and if not, what to do.

Each concern is one module returning typed :class:`Finding` s: the platform and GPU route
(:mod:`.gpu`), the C extensions and their libjpeg (:mod:`.extensions`), host resources against a
loader plan (:mod:`.resources`), and remote-storage backends (:mod:`.backends`). Importing this
package imports neither torch nor anything CUDA.
"""

from __future__ import annotations

from shardkit.doctor.backends import check_backends
from shardkit.doctor.extensions import check_crc, check_extensions
from shardkit.doctor.findings import Finding, LoaderPlan, Status
from shardkit.doctor.gpu import check_platform
from shardkit.doctor.resources import check_resources

__all__ = ["Finding", "LoaderPlan", "Status", "diagnose"]


def diagnose(plan: LoaderPlan) -> list[Finding]:
    """Run every check for a loader configured like ``plan``; findings in report order.

    Example::

        problems = [f for f in diagnose(LoaderPlan(workers=8, batch_size=256, size=224))
                    if f.status == "problem"]
    """
    return [*check_platform(), *check_extensions(), check_crc(), *check_resources(plan), *check_backends()]
