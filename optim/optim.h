// The optimizers: everything under tg::optim in one include.
#pragma once
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"
