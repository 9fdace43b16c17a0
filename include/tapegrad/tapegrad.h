// The umbrella header: everything in tapegrad's public API, namespace tg.
#pragma once
#include <tapegrad/core/cuda.h>
#include <tapegrad/core/cuda_graph.h>
#include <tapegrad/core/cuda_rtc.h>
#include <tapegrad/core/device.h>
#include <tapegrad/core/dlpack.h>
#include <tapegrad/core/dtype.h>
#include <tapegrad/core/error.h>
#include <tapegrad/core/ops.h>
#include <tapegrad/core/shape.h>
#include <tapegrad/core/tensor.h>
#include <tapegrad/core/tensor_options.h>
// ---- issue 16: StateDict and the generators' state
#include <tapegrad/core/rng.h>
#include <tapegrad/core/state_dict.h>
#if __has_include(<tapegrad/autograd/autograd.h>)
#include <tapegrad/autograd/autograd.h>
#endif
#if __has_include(<tapegrad/autograd/custom_function.h>)
#include <tapegrad/autograd/custom_function.h>
#endif
#if __has_include(<tapegrad/autograd/checkpoint.h>)
#include <tapegrad/autograd/checkpoint.h>
#endif
#if __has_include(<tapegrad/nn/nn.h>)
#include <tapegrad/nn/nn.h>
#endif
#if __has_include(<tapegrad/optim/optim.h>)
#include <tapegrad/optim/optim.h>
#endif
#if __has_include(<tapegrad/data/data.h>)
#include <tapegrad/data/data.h>
#endif
#if __has_include(<tapegrad/export/export.h>)
#include <tapegrad/export/export.h>
#endif
#if __has_include(<tapegrad/amp/amp.h>)
#include <tapegrad/amp/amp.h>
#endif
