// tg::nn in one include: modules, layers, activations, losses, init and checkpoints.
#pragma once
#include "nn/activation.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/sequential.h"
#include "nn/serialize.h"
