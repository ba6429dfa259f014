"""NVML adapter (nvidia-ml-py): the only module that imports pynvml.

Produces the raw value sets :mod:`nvml_values` parses. Each NVML call that
fails records the NVML error name instead of a value, so one unsupported
query never hides the others. ``nvmlInit`` failures become
:class:`~gpufleet.health.hardware.NoGpuFound` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpufleet.health.hardware import HardwareError, NoGpuFound

NVLINK_MAX_LINKS = 18


class Nvml:
    """An initialised NVML session."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NoGpuFound("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from exc
        self._nv: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NoGpuFound(
                f"NVML could not start ({exc}); is the NVIDIA driver installed and loaded?"
            ) from exc
        if self.count() == 0:
            raise NoGpuFound("the NVIDIA driver is loaded but reports no GPU")

    def count(self) -> int:
        """GPUs NVML sees (without touching CUDA); raises HardwareError when it cannot say."""
        nv = self._nv
        try:
            count: int = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            raise HardwareError(f"nvmlDeviceGetCount failed: {exc}") from exc
        return count

    def close(self) -> None:
        try:  # noqa: SIM105
            self._nv.nvmlShutdown()
        except Exception:
            pass

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._nv.NVMLError as exc:
            return _error_name(self._nv, exc)

    def busy(self) -> bool:
        """Whether any GPU has running compute processes; raises HardwareError when
        a GPU's processes cannot be read (unknown is not idle)."""
        nv = self._nv
        for i in range(self.count()):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except nv.NVMLError as exc:
                raise HardwareError(f"GPU {i}: no NVML handle: {exc}") from exc
            procs = self._call(lambda h=h: nv.nvmlDeviceGetComputeRunningProcesses(h))  # type: ignore[misc]
            if not isinstance(procs, list):
                raise HardwareError(f"GPU {i}: running processes unreadable: {procs}")
            if procs:
                return True
        return False

    def gpus(self) -> list[dict[str, Any]]:
        nv = self._nv
        out = []
        for i in range(self.count()):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except nv.NVMLError as exc:
                out.append({"index": i, "name": _error_name(nv, exc)})
                continue
            out.append(self._read(i, h))
        return out

    def _read(self, i: int, h: Any) -> dict[str, Any]:
        nv = self._nv
        c = self._call
        raw: dict[str, Any] = {"index": i}
        raw["name"] = _text(c(lambda: nv.nvmlDeviceGetName(h)))
        raw["uuid"] = _text(c(lambda: nv.nvmlDeviceGetUUID(h)))
        pci = c(lambda: nv.nvmlDeviceGetPciInfo(h))
        raw["pci_bus_id"] = _text(getattr(pci, "busId", pci))
        memory = c(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        raw["memory_total_bytes"] = getattr(memory, "total", memory)
        unc, cor = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
        vol, agg = nv.NVML_VOLATILE_ECC, nv.NVML_AGGREGATE_ECC
        raw["ecc_uncorrected_volatile"] = c(lambda: nv.nvmlDeviceGetTotalEccErrors(h, unc, vol))
        raw["ecc_uncorrected_aggregate"] = c(lambda: nv.nvmlDeviceGetTotalEccErrors(h, unc, agg))
        raw["ecc_corrected_volatile"] = c(lambda: nv.nvmlDeviceGetTotalEccErrors(h, cor, vol))
        rows = c(lambda: nv.nvmlDeviceGetRemappedRows(h))
        raw["remapped_rows"] = list(rows) if isinstance(rows, tuple | list) else rows
        sbe = nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        dbe = nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        raw["retired_pages_sbe"] = _count(c(lambda: nv.nvmlDeviceGetRetiredPages(h, sbe)))
        raw["retired_pages_dbe"] = _count(c(lambda: nv.nvmlDeviceGetRetiredPages(h, dbe)))
        raw["retired_pages_pending"] = c(lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h))
        reasons = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        raw["clocks_event_reasons"] = c(lambda: reasons(h))
        raw["temperature_c"] = c(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        raw["power_mw"] = c(lambda: nv.nvmlDeviceGetPowerUsage(h))
        raw["power_limit_mw"] = c(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
        raw["pcie_gen"] = c(lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h))
        raw["pcie_gen_max"] = c(lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h))
        raw["pcie_width"] = c(lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h))
        raw["pcie_width_max"] = c(lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h))
        links = []
        for link in range(NVLINK_MAX_LINKS):
            state = c(lambda link=link: nv.nvmlDeviceGetNvLinkState(h, link))  # type: ignore[misc]
            if isinstance(state, int):
                links.append(state)
        raw["nvlink_state"] = links
        raw.update(self._fabric(h))
        return raw

    def _fabric(self, h: Any) -> dict[str, Any]:
        """``nvmlDeviceGetGpuFabricInfoV`` (v3: with the health summary), else the
        older ``nvmlDeviceGetGpuFabricInfo``. NOT_SUPPORTED is the state "not
        supported"; any other error is kept (the fabric is then unknown)."""
        nv = self._nv
        info: Any
        try:
            if hasattr(nv, "c_nvmlGpuFabricInfo_v3_t") and hasattr(
                nv, "nvmlDeviceGetGpuFabricInfoV"
            ):
                info = nv.c_nvmlGpuFabricInfo_v3_t()
                nv.nvmlDeviceGetGpuFabricInfoV(h, nv.byref(info))
            elif hasattr(nv, "nvmlDeviceGetGpuFabricInfo"):
                info = nv.c_nvmlGpuFabricInfo_t()
                nv.nvmlDeviceGetGpuFabricInfo(h, nv.byref(info))
            else:
                return {}
        except nv.NVMLError as exc:
            name = _error_name(nv, exc)
            if name == "NVML_ERROR_NOT_SUPPORTED":
                return {"fabric_state": 0}
            return {"fabric_state": name}
        raw: dict[str, Any] = {
            "fabric_state": int(info.state),
            "fabric_status": int(info.status),
            "fabric_clique_id": int(info.cliqueId),
            "fabric_cluster_uuid": _uuid(bytes(info.clusterUuid)),
        }
        if hasattr(info, "healthMask"):
            raw["fabric_health_mask"] = int(info.healthMask)
        if hasattr(info, "healthSummary"):
            raw["fabric_health_summary"] = int(info.healthSummary)
        if raw["fabric_status"] != 0:
            raw["fabric_status"] = _error_name(nv, nv.NVMLError(raw["fabric_status"]))
        return raw


def _error_name(nv: Any, exc: Exception) -> str:
    code = getattr(exc, "value", None)
    for name in dir(nv):
        if name.startswith("NVML_ERROR_") and getattr(nv, name) == code:
            return name
    return f"NVML_ERROR({exc})"


def _uuid(data: bytes) -> str:
    """16 bytes as a UUID string (``nvidia-smi``'s ClusterUUID form)."""
    h = data.hex().ljust(32, "0")[:32]
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _count(value: Any) -> Any:
    return len(value) if isinstance(value, list) else value
