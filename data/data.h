// tg::data in one include: TensorDataset and DataLoader.
#pragma once
#include "data/dataloader.h"
#include "data/dataset.h"
