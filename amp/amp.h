// tg::amp: automatic mixed precision. The autocast guard and cast policy
// (amp/autocast.h) and the device-side GradScaler (amp/grad_scaler.h).
#pragma once
#include <tapegrad/amp/autocast.h>
#include <tapegrad/amp/grad_scaler.h>
