// Consumer smoke test: includes the installed umbrella header, makes two tensors,
// adds them and checks the values on the host. Exit status 0 on success. The project has its
// own core/tensor.h, data/dataset.h and nn/module.h on its include path, included before and
// after tapegrad's: tapegrad's headers must never resolve to them.
#include "nn/module.h"

#include <tapegrad/nn/module.h>
#include <tapegrad/tapegrad.h>

#include "core/tensor.h"
#include "data/dataset.h"

#include <cstdio>
#include <iostream>
#include <vector>

int main() {
  try {
    auto a = tg::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
    auto b = tg::ones({2, 3});
    auto c = a + b;
    std::cout << "tapegrad " << tg::version() << ", cuda available: " << tg::cuda::is_available() << "\n";
    std::cout << c << "\n";
    std::vector<float> v = c.to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] != static_cast<float>(i + 2)) {
        std::fprintf(stderr, "consumer: element %zu is %g, expected %zu\n", i, v[i], i + 2);
        return 1;
      }
    }
    user::Dataset d;
    if (user::module_size(d) != static_cast<int>(c.numel())) {
      std::fprintf(stderr, "consumer: the user's own headers were not the ones included\n");
      return 1;
    }
    std::puts("consumer: OK");
    return 0;
  } catch (const tg::Error& e) {
    std::fprintf(stderr, "consumer: tg::Error: %s\n", e.what());
    return 1;
  }
}
