// The optimizers: everything under tg::optim in one include.
#pragma once
#include <tapegrad/optim/adagrad.h>
#include <tapegrad/optim/adam.h>
#include <tapegrad/optim/lr_scheduler.h>
#include <tapegrad/optim/optimizer.h>
#include <tapegrad/optim/rmsprop.h>
#include <tapegrad/optim/sgd.h>
