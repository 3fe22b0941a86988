# layers.cmake — one object target per layer of src/, whose include path reaches only the layers
# it stands on.
#
# Every header of the library is included by its layer-qualified path ("kv/kv_manager.h"). A
# layer's include path is not src/ but a directory of the build tree, layers/<layer>/, holding
# links to the top-level headers of the layer itself and of the layers listed in its DEPS
# (subfolders such as backend/cpu/ are private to their own target). Including a header of any
# other layer therefore fails to compile with "No such file or directory": the dependency order
# of ARCHITECTURE.md is checked by every build, not by a script one may forget to run.
#
#   loom_layer(<name> [DIR <folder under src/>] DEPS <layer>... [EXCLUDE <file>...])
#       adds the object target loom_layer_<name> over src/<folder>/*.c (folder = name unless
#       DIR says otherwise) and appends its objects to LOOM_LAYER_OBJECTS.
#   loom_layer_use(<target> <layer>)
#       gives another target (the instruction-set variants of tensor/, a test probe) the
#       include path and compile settings of <layer>.

set(LOOM_LAYER_FARM ${PROJECT_BINARY_DIR}/layers)
file(REMOVE_RECURSE ${LOOM_LAYER_FARM}) # no link to a deleted header survives a reconfigure
set(LOOM_LAYER_OBJECTS "")

# Links the top-level headers of src/<dir> into <farm>/<dir>/.
function(loom__layer_link_headers farm dir)
    file(GLOB headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${dir}/*.h)
    file(MAKE_DIRECTORY ${farm}/${dir})
    foreach(h IN LISTS headers)
        get_filename_component(n ${h} NAME)
        file(CREATE_LINK ${h} ${farm}/${dir}/${n} SYMBOLIC)
    endforeach()
endfunction()

function(loom_layer_use target layer)
    target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/include
                                                 ${LOOM_LAYER_FARM}/${layer})
    target_compile_definitions(${target} PRIVATE _GNU_SOURCE LOOM_BUILD)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C>:${LOOM_C_WARNINGS}>)
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON
                                               C_VISIBILITY_PRESET hidden)
endfunction()

function(loom_layer name)
    cmake_parse_arguments(L "" "DIR" "DEPS;EXCLUDE" ${ARGN})
    if(NOT L_DIR)
        set(L_DIR ${name})
    endif()
    set_property(GLOBAL PROPERTY LOOM_LAYER_DIR_${name} ${L_DIR})
    set(farm ${LOOM_LAYER_FARM}/${name})
    loom__layer_link_headers(${farm} ${L_DIR})
    foreach(dep IN LISTS L_DEPS)
        get_property(dep_dir GLOBAL PROPERTY LOOM_LAYER_DIR_${dep})
        if(NOT dep_dir)
            message(FATAL_ERROR "loom_layer(${name}): ${dep} is not a layer defined before it")
        endif()
        loom__layer_link_headers(${farm} ${dep_dir})
    endforeach()

    file(GLOB sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/${L_DIR}/*.c)
    if(L_EXCLUDE)
        list(REMOVE_ITEM sources ${L_EXCLUDE})
    endif()
    add_library(loom_layer_${name} OBJECT ${sources})
    loom_layer_use(loom_layer_${name} ${name})
    if(LOOM_NATIVE)
        target_compile_options(loom_layer_${name} PRIVATE -march=native)
    endif()
    set(LOOM_LAYER_OBJECTS ${LOOM_LAYER_OBJECTS} $<TARGET_OBJECTS:loom_layer_${name}>
        PARENT_SCOPE)
endfunction()
