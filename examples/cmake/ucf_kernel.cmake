# ucf_kernel(NAME STATEMENT FORMAT...): a build rule that writes NAME.c, NAME.h
# and ucf.h into UCF_KERNELS with `python -m ucf compile`. Needs
# find_package(Python3 COMPONENTS Interpreter) first, with a Python that
# imports ucf. A UCF_KERNELS directory that already holds the files (from a
# Makefile, say) is used as it is.
set(UCF_KERNELS ${CMAKE_CURRENT_BINARY_DIR}/kernels CACHE PATH "generated ucf kernels")

function(ucf_kernel name statement)
  set(formats)
  foreach(f IN LISTS ARGN)
    list(APPEND formats -f ${f})
  endforeach()
  add_custom_command(
    OUTPUT ${UCF_KERNELS}/${name}.c ${UCF_KERNELS}/${name}.h
    COMMAND ${Python3_EXECUTABLE} -m ucf compile "${statement}" ${formats}
            -o ${UCF_KERNELS}/${name}
    COMMENT "ucf: generating ${name}"
    VERBATIM)
endfunction()
