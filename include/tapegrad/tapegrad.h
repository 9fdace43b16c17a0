// The umbrella header: everything in tapegrad's public API, namespace tg.
#pragma once
#include "core/cuda.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "core/tensor_options.h"
#if __has_include("autograd/autograd.h")
#include "autograd/autograd.h"
#endif
