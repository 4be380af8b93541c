#pragma once
// Stands in for the CUDA runtime when the .cu sources are compiled for the
// host SIMT emulator (this directory first on the include path).
#include "simt_host.h"
