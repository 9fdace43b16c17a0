// tg::data in one include: TensorDataset, DataLoader, Dataset with its samplers and
// DataLoader<dynamic_extent>, the .npy and IDX readers and writers
// (tg::load_npy / tg::save_npy, tg::load_idx / tg::save_idx), the ProgressBar and the MetricsLog.
#pragma once
#include <tapegrad/data/dataloader.h>
#include <tapegrad/data/dataset_loader.h>
#include <tapegrad/data/dataset.h>
#include <tapegrad/data/idx.h>
#include <tapegrad/data/metrics_log.h>
#include <tapegrad/data/npy.h>
#include <tapegrad/data/progress_bar.h>
#include <tapegrad/data/sampler.h>
