// tg::data in one include: TensorDataset and DataLoader.
#pragma once
#include <tapegrad/data/dataloader.h>
#include <tapegrad/data/dataset.h>
