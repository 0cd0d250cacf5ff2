"""vllm.platforms.current_platform, as far as the indexer asks it."""


class _Platform:
    def is_cuda(self) -> bool:
        return True

    def is_xpu(self) -> bool:
        return False

    def is_device_capability_family(self, family: int) -> bool:
        return family == 100


current_platform = _Platform()
