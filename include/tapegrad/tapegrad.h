// The umbrella header: everything in tapegrad's public API, namespace tg.
#pragma once
#include "core/cuda.h"
#include "core/cuda_graph.h"
#include "core/cuda_rtc.h"
#include "core/device.h"
#include "core/dlpack.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "core/tensor_options.h"
#if __has_include("autograd/autograd.h")
#include "autograd/autograd.h"
#endif
#if __has_include("autograd/custom_function.h")
#include "autograd/custom_function.h"
#endif
#if __has_include("nn/nn.h")
#include "nn/nn.h"
#endif
#if __has_include("optim/optim.h")
#include "optim/optim.h"
#endif
#if __has_include("data/data.h")
#include "data/data.h"
#endif
#if __has_include("export/export.h")
#include "export/export.h"
#endif
#if __has_include("amp/amp.h")
#include "amp/amp.h"
#endif
