"""vllm.platforms.current_platform, as far as the indexer asks it."""


class _Platform:
    def is_cuda(self) -> bool:
        return True

    def is_xpu(self) -> bool:
        return False

    def is_device_capability_family(self, family: int) -> bool:
        return family == 100

    def has_device_capability(self, capability: int) -> bool:
        return capability <= 100

    def is_rocm(self) -> bool:
        return False


current_platform = _Platform()
