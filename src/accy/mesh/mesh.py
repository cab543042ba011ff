"""`Mesh`: devices laid out on named mesh axes, and the axis mapping a program is sharded by."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import MeshError


class Mesh:
    """Devices in an array whose axes have names: `Mesh(range(4), "data")` is four devices on
    one mesh axis, `Mesh(np.arange(8).reshape(2, 4), ("data", "model"))` eight on two.

    Devices are anything hashable that names a device: GPU ordinals, or abstract ids for the
    simulated mesh that the reference and CPU executables run in one process. A device's *rank*
    is its position in the flattened array (row-major), its *coordinates* its position along
    each mesh axis.

    >>> mesh = Mesh(np.arange(8).reshape(2, 4), ("data", "model"))
    >>> mesh.shape, mesh.size, mesh.coordinates(5)
    ({'data': 2, 'model': 4}, 8, {'data': 1, 'model': 1})
    >>> mesh.group(5, "data")
    [1, 5]
    """

    def __init__(self, devices: Any, axis_names: str | Iterable[str]):
        names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
        array = np.array(list(devices) if isinstance(devices, range) else devices, dtype=object)
        if array.ndim != len(names):
            raise MeshError(
                f"Mesh: {len(names)} axis name(s) {names} for a device array of {array.ndim} "
                f"dimension(s) (shape {array.shape}); give one name per dimension"
            )
        if len(set(names)) != len(names) or not all(
            isinstance(n, str) and n.isidentifier() for n in names
        ):
            raise MeshError(f"Mesh: axis names {names} must be distinct identifiers")
        if array.size == 0:
            raise MeshError("Mesh: the device array is empty")
        flat = array.ravel().tolist()
        if len(set(flat)) != len(flat):
            raise MeshError(f"Mesh: devices {flat} name a device twice")
        self.devices = array
        self.axis_names = names

    @property
    def shape(self) -> dict[str, int]:
        """Mesh axis name to the number of devices along it."""
        return dict(zip(self.axis_names, self.devices.shape, strict=True))

    @property
    def size(self) -> int:
        """The number of devices."""
        return int(self.devices.size)

    @property
    def device_list(self) -> list[Any]:
        """The devices in rank order."""
        return self.devices.ravel().tolist()

    def axis_size(self, mesh_axis: str) -> int:
        """The number of devices along `mesh_axis` (a clear MeshError if there is none)."""
        self.check_axis(mesh_axis)
        return self.shape[mesh_axis]

    def check_axis(self, mesh_axis: str, where: str = "") -> None:
        if mesh_axis not in self.axis_names:
            raise MeshError(
                f"{where}mesh axis {mesh_axis!r} is not on the mesh; its axes are "
                f"{', '.join(f'{n} ({s} devices)' for n, s in self.shape.items())}"
            )

    def coordinates(self, rank: int) -> dict[str, int]:
        """Device `rank`'s position along each mesh axis."""
        position = np.unravel_index(rank, self.devices.shape)
        return {n: int(p) for n, p in zip(self.axis_names, position, strict=True)}

    def group(self, rank: int, mesh_axis: str) -> list[int]:
        """The ranks that meet device `rank` in a collective over `mesh_axis`, in order of their
        position along it (device `rank` among them)."""
        self.check_axis(mesh_axis)
        position = list(np.unravel_index(rank, self.devices.shape))
        along = self.axis_names.index(mesh_axis)
        ranks = []
        for i in range(self.devices.shape[along]):
            position[along] = i
            ranks.append(int(np.ravel_multi_index(position, self.devices.shape)))
        return ranks

    def __repr__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in self.shape.items())
        return f"Mesh({axes}; devices {self.device_list})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Mesh)
            and self.axis_names == other.axis_names
            and self.devices.shape == other.devices.shape
            and self.device_list == other.device_list
        )

    def __hash__(self) -> int:
        return hash((self.axis_names, self.devices.shape, tuple(map(str, self.device_list))))


def check_axis_mapping(mesh: Mesh, axis_mapping: Mapping[str, str]) -> dict[str, str]:
    """`axis_mapping` (program axis name -> mesh axis name) as a dict, checked against `mesh`.
    Its order is the priority order: when two axes of one value map to the same mesh axis, the
    one listed first is sharded and the other kept whole.

    >>> check_axis_mapping(Mesh(range(2), "data"), {"batch": "data"})
    {'batch': 'data'}
    """
    if not isinstance(axis_mapping, Mapping):
        raise MeshError(
            f"the axis mapping must map program axis names to mesh axis names, such as "
            f"{{'batch': 'data'}}; got {axis_mapping!r}"
        )
    mapping = dict(axis_mapping)
    for axis, mesh_axis in mapping.items():
        if not isinstance(axis, str) or not isinstance(mesh_axis, str):
            raise MeshError(f"axis mapping entry {axis!r}: {mesh_axis!r} must map str to str")
        mesh.check_axis(mesh_axis, f"axis mapping {{{axis!r}: {mesh_axis!r}}}: ")
    return mapping


__all__ = ["Mesh", "check_axis_mapping"]
