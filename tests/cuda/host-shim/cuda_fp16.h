// host shim (tests/cuda/host-shim/cuda_host_shim.hpp)
#pragma once
#include "cuda_host_shim.hpp"
