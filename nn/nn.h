// tg::nn in one include: modules, layers, activations, losses, init and checkpoints.
#pragma once
#include <tapegrad/nn/activation.h>
#include <tapegrad/nn/init.h>
#include <tapegrad/nn/linear.h>
#include <tapegrad/nn/loss.h>
#include <tapegrad/nn/module.h>
#include <tapegrad/nn/sequential.h>
#include <tapegrad/nn/serialize.h>
// ---- issue 15: classification losses, Softmax / LogSoftmax
#include <tapegrad/nn/classification.h>
// ---- issue 15: normalization, embedding, dropout
#include <tapegrad/nn/dropout.h>
#include <tapegrad/nn/embedding.h>
#include <tapegrad/nn/module_list.h>
#include <tapegrad/nn/normalization.h>
// ---- issue 16: gradient clipping
#include <tapegrad/nn/clip_grad.h>
// ---- issue 17: pooling, Flatten
#include <tapegrad/nn/pooling.h>

// ---- issue 16: whole training state in one checkpoint
#include <tapegrad/nn/checkpoint.h>

// ---- issue 17: batch_norm, group_norm and their modules
#include <tapegrad/nn/batch_norm.h>

// ---- issue 17: convolution
#include <tapegrad/nn/conv.h>

// ---- issue 18: scaled_dot_product_attention, MultiheadAttention
#include <tapegrad/nn/attention.h>

// ---- issue 17: interpolate, Upsample
#include <tapegrad/nn/upsample.h>
