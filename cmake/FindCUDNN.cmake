# FindCUDNN: locates cuDNN's headers and library and defines the imported target CUDNN::cudnn.
#
# Searched, in order: CUDNN_ROOT (CMake variable, then environment), the CUDA toolkit,
# a pip install of `nvidia-cudnn-cu*` (site-packages/nvidia/cudnn, found through the Python
# interpreter and in a few usual virtual environments), then the standard system paths.
# A pip install ships only `libcudnn.so.9` (no unversioned symlink), so versioned names
# are searched too.
#
# Result variables: CUDNN_FOUND, CUDNN_INCLUDE_DIRS, CUDNN_LIBRARIES, CUDNN_VERSION
# (and CUDNN_VERSION_MAJOR/MINOR/PATCH). Cache variables: CUDNN_INCLUDE_DIR, CUDNN_LIBRARY.

set(_cudnn_hints)
if(CUDNN_ROOT)
  list(APPEND _cudnn_hints ${CUDNN_ROOT})
endif()
if(DEFINED ENV{CUDNN_ROOT})
  list(APPEND _cudnn_hints $ENV{CUDNN_ROOT})
endif()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _cudnn_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(_d ${CUDAToolkit_INCLUDE_DIRS})
    get_filename_component(_p ${_d} DIRECTORY)
    list(APPEND _cudnn_hints ${_p})
  endforeach()
endif()

# pip wheels: ask the Python interpreter where its site-packages are (no import of cudnn
# needed: `nvidia` is a namespace package that may not import cleanly on its own).
if(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
  find_program(_cudnn_python NAMES python3 python)
  if(_cudnn_python)
    execute_process(
      COMMAND ${_cudnn_python} -c "import site, sysconfig; print(';'.join(site.getsitepackages() + [sysconfig.get_paths()['purelib']]))"
      OUTPUT_VARIABLE _cudnn_site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _cudnn_rc)
    if(_cudnn_rc EQUAL 0)
      foreach(_s ${_cudnn_site})
        list(APPEND _cudnn_hints ${_s}/nvidia/cudnn)
      endforeach()
    endif()
  endif()
  unset(_cudnn_python CACHE)
  # The GPU machine's PyTorch venv, and other usual venv places.
  file(GLOB _cudnn_venvs /opt/torch/.venv/lib/python3*/site-packages/nvidia/cudnn
       /opt/*/.venv/lib/python3*/site-packages/nvidia/cudnn $ENV{HOME}/.local/lib/python3*/site-packages/nvidia/cudnn
       /usr/local/lib/python3*/dist-packages/nvidia/cudnn)
  list(APPEND _cudnn_hints ${_cudnn_venvs})
endif()
list(REMOVE_DUPLICATES _cudnn_hints)

find_path(CUDNN_INCLUDE_DIR NAMES cudnn.h
  HINTS ${_cudnn_hints}
  PATH_SUFFIXES include include/x86_64-linux-gnu targets/x86_64-linux/include
  PATHS /usr/local/cuda /usr)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 libcudnn.so.8 NAMES_PER_DIR
  HINTS ${_cudnn_hints}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu targets/x86_64-linux/lib
  PATHS /usr/local/cuda /usr)

if(CUDNN_INCLUDE_DIR)
  # cuDNN >= 8 keeps the version macros in cudnn_version.h.
  set(_cudnn_vh ${CUDNN_INCLUDE_DIR}/cudnn_version.h)
  if(NOT EXISTS ${_cudnn_vh})
    set(_cudnn_vh ${CUDNN_INCLUDE_DIR}/cudnn.h)
  endif()
  file(STRINGS ${_cudnn_vh} _cudnn_lines REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  foreach(_part MAJOR MINOR PATCHLEVEL)
    string(REGEX MATCH "CUDNN_${_part} +([0-9]+)" _m "${_cudnn_lines}")
    set(_cudnn_${_part} ${CMAKE_MATCH_1})
  endforeach()
  if(_cudnn_MAJOR)
    set(CUDNN_VERSION_MAJOR ${_cudnn_MAJOR})
    set(CUDNN_VERSION_MINOR ${_cudnn_MINOR})
    set(CUDNN_VERSION_PATCH ${_cudnn_PATCHLEVEL})
    set(CUDNN_VERSION ${_cudnn_MAJOR}.${_cudnn_MINOR}.${_cudnn_PATCHLEVEL})
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN
  REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
  VERSION_VAR CUDNN_VERSION)

if(CUDNN_FOUND)
  set(CUDNN_INCLUDE_DIRS ${CUDNN_INCLUDE_DIR})
  set(CUDNN_LIBRARIES ${CUDNN_LIBRARY})
  if(NOT TARGET CUDNN::cudnn)
    add_library(CUDNN::cudnn UNKNOWN IMPORTED)
    set_target_properties(CUDNN::cudnn PROPERTIES
      IMPORTED_LOCATION ${CUDNN_LIBRARY}
      INTERFACE_INCLUDE_DIRECTORIES ${CUDNN_INCLUDE_DIR})
  endif()
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
unset(_cudnn_hints)
